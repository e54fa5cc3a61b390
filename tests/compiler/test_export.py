"""Exporting a compiled diagram (issue 35): torch.export of every zoo model with a dynamic batch,
and ONNX files (penrose.export_onnx, `penrose export`) run in onnxruntime against eager PyTorch.

onnxruntime is the second implementation here: the file is loaded and run by a runtime that
shares nothing with torch, at batch sizes other than the traced one, and compared value by value
with the eager module. The dynamo ONNX exporter takes seconds per model, so the default run
exports a few zoo models that between them hold every kind of input and leg (a bool mask, a leg
sized by the input, a causal mask, top-k) and the regressions below; every zoo model is
exported under `slow` (PENROSE_REDUCED=1 keeps to the few), Steerling's whole net too."""

from __future__ import annotations

import os
import stat

import onnx
import onnxruntime
import pytest
import torch
from test_module_like_any_other import SMALL_CONCEPT, SMALL_MODEL

import penrose
import penrose_zoo
from penrose.cli import main
from penrose.export import dynamic_shapes, example_inputs, export_program
from penrose_zoo.steerling import Steerling

REDUCED = os.environ.get("PENROSE_REDUCED", "") not in ("", "0")
#: exported to ONNX in every run: a bool mask and a where (interventions), a leg sized by the
#: input with a causal mask, top-k
ONNX_SUBSET = ["concept_bottleneck", "causal_self_attention", "topk_sparse_autoencoder"]


def _outputs(out) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else list(out)


def _run_onnx(path, inputs: dict) -> list[torch.Tensor]:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [torch.from_numpy(a) for a in session.run(None, {k: v.numpy() for k, v in inputs.items()})]


def _assert_onnx_equals_eager(path, model, inputs):
    with torch.no_grad():
        want = _outputs(model(**inputs))
    got = _run_onnx(path, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


# ---- torch.export -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(penrose_zoo.MODELS))
def test_every_zoo_model_exports_with_a_dynamic_batch(name):
    """torch.export.export of the zoo model itself (its wrapper, as a user holds it) on the zoo's
    example inputs with a dynamic batch; the program run at another batch size equals eager."""
    entry = penrose_zoo.MODELS[name]
    torch.manual_seed(0)
    model = entry.build().eval()
    inputs = entry.example_inputs(batch=3)
    batch = torch.export.Dim("batch")
    program = torch.export.export(model, (), inputs, dynamic_shapes={k: {0: batch} for k in inputs})
    for n in (5, 2):
        inputs = entry.example_inputs(batch=n)
        got, want = program.module()(**inputs), model(**inputs)
        assert type(got) is type(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)


def test_export_program_makes_legs_sized_by_the_input_dynamic():
    """export_program: the batch and a dim declared without a size (t) are both dynamic."""
    m = penrose.compile("dim t, e = 3\ninput Z[t, e]\nparam W[e, e]\ny = einsum('te,ef->tf', Z, W)\noutput y", seed=0)
    assert dynamic_shapes(m)["Z"].keys() == {0, 1}
    program = export_program(m)
    z = torch.randn(4, 11, 3)
    torch.testing.assert_close(program.module()(Z=z), m(Z=z))


def test_a_bound_on_a_dynamic_leg_is_kept():
    """select(x, t, 5) needs t >= 6: torch.export says so ("Suggested fixes") and the program
    keeps t dynamic with that bound, where a strict export would fail."""
    m = penrose.compile("dim t, e = 3\ninput x[t, e]\nparam W[e]\ny = select(x, t, 5) * W\noutput y", seed=0)
    program = export_program(m)
    x = torch.randn(2, 9, 3)
    torch.testing.assert_close(program.module()(x=x), m(x=x))
    assert sorted((r.lower, r.upper) for r in program.range_constraints.values())[0] == (0, torch.utils._sympy.numbers.IntInfinity())
    assert any(r.lower == 6 for r in program.range_constraints.values())


def test_regression_causal_mask_under_torch_export_with_a_dynamic_length():
    """torch.export of a diagram with a causal mask raised "unhashable type: non-nested SymInt":
    the runtime looked its mask up in a dict keyed by the (symbolic) length."""
    text = ("dim t, p, e = 4\ninput x[t, e]\nparam W[e, e]\ns = einsum('te,pe->tp', x, einsum('pe,ef->pf', x, W))\n"
            "y = softmax(where(causal(t, p), s, -inf), p)\noutput y")
    m = penrose.compile(text, seed=0)
    m(x=torch.randn(6, 4))  # a mask of length 6 remembered in eager mode: tracing must not read it
    program = export_program(m)
    x = torch.randn(3, 6, 4)
    torch.testing.assert_close(program.module()(x=x), m(x=x))


# ---- ONNX -------------------------------------------------------------------------------------


def _zoo_params():
    names = ONNX_SUBSET if REDUCED else sorted(penrose_zoo.MODELS)
    return [pytest.param(n, marks=() if n in ONNX_SUBSET else pytest.mark.slow) for n in names]


@pytest.mark.parametrize("name", _zoo_params())
def test_zoo_model_as_onnx_runs_in_onnxruntime_equal_to_eager(name, tmp_path):
    """The zoo model's diagram written as ONNX, run in onnxruntime at two batch sizes (neither
    the traced one) on the zoo's example inputs, equal to the eager zoo model's outputs."""
    entry = penrose_zoo.MODELS[name]
    torch.manual_seed(0)
    model = entry.build().eval()
    out = penrose.export_onnx(model.diagram, tmp_path / f"{name}.onnx")
    graph = onnx.load(str(out)).graph
    assert [i.name for i in graph.input] == [s[0] for s in model.diagram._INPUTS]
    assert [o.name for o in graph.output] == [n for n, _ in model.diagram.penrose_checked.outputs]
    assert all(i.type.tensor_type.shape.dim[0].dim_param == "batch" for i in graph.input)
    for batch in (3, 7):
        _assert_onnx_equals_eager(out, model, entry.example_inputs(batch=batch))  # the zoo model's own forward


@pytest.mark.slow
def test_steerling_small_config_as_onnx_equal_to_its_forward(tmp_path):
    """Steerling's compiled net (its forward without interventions: Steerling.forward runs
    exactly `net(ids=...)` then; interventions are Python-level choices among the net's entries)
    as ONNX, at two batch sizes and two lengths, equal to Steerling's own logits. The reduced
    form (PENROSE_REDUCED=1) stops at torch.export of the net, compared the same way."""
    torch.manual_seed(0)
    model = Steerling(SMALL_MODEL, SMALL_CONCEPT, 260, seed=0).eval()
    if REDUCED:
        run = export_program(model.net).module()
    else:
        path = penrose.export_onnx(model.net, tmp_path / "steerling.onnx")

        def run(ids):
            return _run_onnx(path, {"ids": ids})

    names = [n for n, _ in model.net.penrose_checked.outputs]
    for shape in ((2, 8), (3, 12)):
        ids = torch.randint(0, 260, shape)
        with torch.no_grad():
            out = model(ids)
            want = _outputs(model.net(ids=ids))
        got = _outputs(run(ids=ids))
        torch.testing.assert_close(got[names.index("logits")], out.logits, atol=1e-5, rtol=1e-5)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_regression_einsum_with_an_empty_ellipsis_loads_in_onnxruntime(tmp_path):
    """A block's einsum on a weight ('...i,...ik->...k', the weight without batch legs) was
    written as ONNX Einsum with ellipses of different lengths, which onnx's checker and
    onnxruntime refuse ("Ellipsis for input 1 represents 0 dimensions"); concept_graph's."""
    text = """\
dim i = 3, k = 3
input x[i]
param W[i, k]
block mix(c[i], V[i, k]) {
  return einsum('i,ik->k', c, V)
}
y = mix(x, W)
output y
"""
    m = penrose.compile(text, seed=0)
    assert "'...i,...ik->...k'" in m.penrose_source  # the einsum this regression is about
    out = penrose.export_onnx(m, tmp_path / "mix.onnx")
    _assert_onnx_equals_eager(out, m, {"x": torch.randn(5, 3)})


# ---- the command and its errors ---------------------------------------------------------------

# an upper-case input name (torch.export lower-cases its placeholders: the graph must not), a
# bool mask, a leg sized by the input, a size given on the command line
CLI_DIAGRAM = """\
# t token, e embedding, r output
dim t, e = 4, r = 2
input Z[t, e]
input keep[t, e] : bool
param W[e, r]
h = where(keep, Z, 0)
y = einsum('te,er->tr', h, W)
s = sum(y, t)
output y, s
"""


def test_cli_writes_an_onnx_file_that_runs_in_onnxruntime(tmp_path, capsys):
    pen = tmp_path / "model.pen"
    pen.write_text(CLI_DIAGRAM, encoding="utf-8")
    out = tmp_path / "model.onnx"
    code = main(["export", str(pen), "-o", str(out), "--size", "e=6"])
    captured = capsys.readouterr()
    assert (code, captured.out, captured.err) == (0, f"wrote {out}\n", "")
    graph = onnx.load(str(out)).graph
    assert [i.name for i in graph.input] == ["Z", "keep"]  # regression: was ['z', 'keep']
    assert [o.name for o in graph.output] == ["y", "s"]
    assert [d.dim_param for d in graph.input[0].type.tensor_type.shape.dim] == ["batch", "t", ""]
    model = penrose.compile(pen, seed=0, e=6)  # the command's weights: seed 0
    for batch, t in ((1, 3), (4, 9)):
        _assert_onnx_equals_eager(out, model, {"Z": torch.randn(batch, t, 6), "keep": torch.rand(batch, t, 6) < 0.7})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.pen"]  # no temporary file left


def test_static_batch_and_an_opset(tmp_path):
    """dynamic_batch=False fixes the batch at `batch`; an opset below the exporter's own converts."""
    pen = tmp_path / "model.pen"
    pen.write_text(CLI_DIAGRAM, encoding="utf-8")
    out = penrose.export_onnx(pen, tmp_path / "fixed.onnx", seed=0, batch=3, dynamic_batch=False, opset=18)
    proto = onnx.load(str(out))
    assert [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim][:1] == [3]
    assert [o.version for o in proto.opset_import if o.domain == ""] == [18]


def test_an_unwritable_output_is_refused_before_any_work(tmp_path, capsys):
    pen = tmp_path / "model.pen"
    pen.write_text(CLI_DIAGRAM, encoding="utf-8")
    missing = tmp_path / "nowhere" / "model.onnx"
    assert main(["export", str(pen), "-o", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err == f"{missing}: error: cannot write {missing}: folder {missing.parent} does not exist\n"
    ro = tmp_path / "ro.onnx"
    ro.write_bytes(b"old")
    ro.chmod(stat.S_IRUSR)
    with pytest.raises(penrose.PenroseError, match=r"cannot write .*ro\.onnx: permission denied") as e:
        penrose.export_onnx(pen, ro)
    assert e.value.file == str(ro) and ro.read_bytes() == b"old"
    assert main(["export", str(pen), "-o", str(pen)]) == 1  # the diagram itself
    assert "it is the diagram" in capsys.readouterr().err and pen.read_text(encoding="utf-8") == CLI_DIAGRAM


def test_a_diagram_that_does_not_check_names_its_line_and_writes_nothing(tmp_path, capsys):
    pen = tmp_path / "bad.pen"
    pen.write_text("dim e = 4\ninput x[e]\ny = sigmod(x)\noutput y\n", encoding="utf-8")
    out = tmp_path / "bad.onnx"
    assert main(["export", str(pen), "-o", str(out)]) == 1
    assert capsys.readouterr().err.splitlines()[0] == f"{pen}:3:5: error: unknown function 'sigmod'; did you mean 'sigmoid'?"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pen"]


def test_an_opset_the_exporter_cannot_write_names_the_file(tmp_path):
    """Asked for opset 7, the exporter logs that it cannot convert and writes its own opset:
    that is an error naming the diagram's file, and nothing is written."""
    pen = tmp_path / "model.pen"
    pen.write_text(CLI_DIAGRAM, encoding="utf-8")
    with pytest.raises(penrose.PenroseCompileError, match=r"cannot write this diagram at opset 7 \(it converts from \d+\)") as e:
        penrose.export_onnx(pen, tmp_path / "old.onnx", opset=7)
    assert e.value.file == str(pen)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pen"]
    with pytest.raises(penrose.PenroseArgumentError, match=r"opset is an ONNX opset from 1 to \d+ .*got 99"):
        penrose.export_onnx(pen, tmp_path / "new.onnx", opset=99)


def test_what_is_no_compiled_diagram_is_refused_with_a_hint(tmp_path):
    zoo_model = penrose_zoo.MODELS["linear"].build()
    with pytest.raises(penrose.PenroseArgumentError, match=r"got LinearModel \(a zoo model: pass model.diagram"):
        penrose.export_onnx(zoo_model, tmp_path / "m.onnx")
    with pytest.raises(penrose.PenroseArgumentError, match="batch is the example batch size, a whole number >= 2, got 1"):
        penrose.export_onnx(zoo_model.diagram, tmp_path / "m.onnx", batch=1)
    assert not list(tmp_path.iterdir())


def test_example_inputs_follow_the_declared_inputs():
    m = penrose.compile(CLI_DIAGRAM.replace("input keep", "input ids[t] : int\ninput keep"), seed=0)
    inputs = example_inputs(m, batch=3)
    assert {k: (tuple(v.shape), v.dtype) for k, v in inputs.items()} == {
        "Z": ((3, 8, 4), torch.float32), "ids": ((3, 8), torch.int64), "keep": ((3, 8, 4), torch.bool)}
