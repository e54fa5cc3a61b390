"""Export a compiled diagram: a `torch.export` program and an ONNX file.

A compiled diagram takes its inputs by name and checks them against the diagram's declared
inputs (the class's `_INPUTS`: name, legs, sizes, kind). From those declarations this module
makes example inputs with one leading batch leg, and the dynamic shapes that say which sizes may
change: the batch, and every leg whose size comes from the input (a dim declared without a size,
such as a token count). `export_onnx` writes the ONNX file through the dynamo exporter
(`torch.onnx.export(..., dynamo=True)`; the `onnx` extra installs onnx, onnxscript and
onnxruntime): its graph's inputs and outputs carry the diagram's names, its batch leg is
`batch`. The file is written atomically (penrose.io), checked with `onnx.checker`, and run in
onnxruntime at another batch size against the eager module.

    >>> import penrose, torch
    >>> m = penrose.compile("dim t, e = 3\\ninput x[t, e]\\nparam W[e, e]\\ny = einsum('te,ef->tf', x, W)\\noutput y", seed=0)
    >>> {k: tuple(v.shape) for k, v in example_inputs(m, batch=2).items()}
    {'x': (2, 8, 3)}
    >>> program = torch.export.export(m, (), example_inputs(m), dynamic_shapes=dynamic_shapes(m))
    >>> program.module()(x=torch.ones(5, 4, 3)).shape
    torch.Size([5, 4, 3])

docs/pytorch.md says what each export carries; TorchScript is not supported (it cannot read
the generated forward's `*args, **kwargs` signature): use torch.export.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from penrose.errors import PenroseArgumentError, PenroseCompileError, PenroseError, Span

if TYPE_CHECKING:
    from penrose.reading import Paths

__all__ = ["dynamic_shapes", "example_inputs", "export_onnx", "export_program"]

#: The example size of a leg whose size comes from the input (distinct from the batch's, so that
#: torch.export does not take the two for one size); each further such dim takes one more.
FREE_SIZE = 8
BATCH = "batch"  # the batch leg's name in the exported programs and the ONNX graph
_TWO_GB = 2**31  # one protobuf holds at most this; larger models keep weights in external files


def _declared(model: torch.nn.Module) -> tuple:
    """The model's declared inputs (name, legs, sizes, kind), or a PenroseArgumentError."""
    spec = getattr(model, "_INPUTS", None)
    if not isinstance(model, torch.nn.Module) or not isinstance(spec, tuple):
        what = type(model).__name__
        hint = " (a zoo model: pass model.diagram; Steerling: model.net)" if hasattr(model, "diagram") or hasattr(model, "net") else ""
        raise PenroseArgumentError(f"expected a compiled diagram (penrose.compile's module), got {what}{hint}")
    return spec


def _free_dims(spec: tuple) -> list[str]:
    """The dims whose size the inputs give (declared without a size), in order of appearance."""
    out: list[str] = []
    for _name, _legs, sizes, _kind in spec:
        out += [s for s in sizes if isinstance(s, str) and s not in out]
    return out


def _reference(model: torch.nn.Module) -> torch.Tensor | None:
    return next((t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()), None)


def example_inputs(model: torch.nn.Module, batch: int = 2, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Inputs for a compiled diagram, by name, each with one leading batch leg of size `batch`:
    floats drawn from a seeded normal (the dtype and device of the model's parameters), ids 0
    (a row of any table), masks drawn at random. A leg sized by the input gets `FREE_SIZE` (the
    next such dim one more).

    >>> import penrose
    >>> m = penrose.compile("dim e = 2\\ninput x[e]\\nparam W[e]\\ny = x * W\\noutput y")
    >>> example_inputs(m, batch=3)["x"].shape
    torch.Size([3, 2])
    """
    spec = _declared(model)
    free = {d: FREE_SIZE + i for i, d in enumerate(_free_dims(spec))}
    ref = _reference(model)
    dtype, device = (ref.dtype, ref.device) if ref is not None else (torch.float32, torch.device("cpu"))
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, _legs, sizes, kind in spec:
        shape = (batch, *(free[s] if isinstance(s, str) else s for s in sizes))
        if kind == "int":
            x = torch.zeros(shape, dtype=torch.int64)
        elif kind == "bool":
            x = torch.rand(shape, generator=g) < 0.5
        else:
            x = torch.randn(shape, generator=g, dtype=dtype if dtype.is_floating_point else torch.float32)
        out[name] = x.to(device)
    return out


def dynamic_shapes(model: torch.nn.Module, dynamic_batch: bool = True) -> dict[str, dict[int, Any]]:
    """torch.export's `dynamic_shapes` for `example_inputs(model)`: axis 0 is the batch (dynamic
    unless `dynamic_batch=False`), and each leg sized by the input is dynamic, one `Dim` per dim
    name (inputs that share a dim share its size).

    >>> import penrose
    >>> m = penrose.compile("dim t, e = 2\\ninput x[t, e]\\nparam W[e]\\ny = x * W\\noutput y")
    >>> dynamic_shapes(m)
    {'x': {0: Dim('batch', min=0), 1: Dim('t', min=0)}}
    """
    spec = _declared(model)
    free = _free_dims(spec)
    batch_name = BATCH if BATCH not in free else BATCH + "_"
    dims = {d: torch.export.Dim(d) for d in free}
    batch = torch.export.Dim(batch_name)
    out: dict[str, dict[int, Any]] = {}
    for name, _legs, sizes, _kind in spec:
        axes = {1 + i: dims[s] for i, s in enumerate(sizes) if isinstance(s, str)}
        out[name] = {0: batch, **axes} if dynamic_batch else axes
    return out


def _where(model: torch.nn.Module) -> str:
    """The diagram's file, for errors (its name where it came from text)."""
    checked = getattr(model, "penrose_checked", None)
    file = getattr(getattr(checked, "diagram", None), "file", "") or ""
    return file if file and not file.startswith("<") else f"diagram {getattr(checked, 'name', type(model).__name__)!r}"


def _first_line(e: BaseException) -> str:
    """The first line of an exporter's message (they run to pages)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def _op(e: BaseException) -> str:
    """The torch operation an exporter's error names (`aten.topk.default`), or ''."""
    found = re.search(r"\b(?:aten|prims|torch\.ops\.\w+)(?:::|\.)\w+(?:\.\w+)?", str(e))
    return f" (operation {found.group(0)})" if found else ""


def export_program(model: torch.nn.Module, *, batch: int = 2, dynamic_batch: bool = True) -> torch.export.ExportedProgram:
    """`torch.export.export` of a compiled diagram on `example_inputs(model, batch)`, traced for
    inference (under torch.no_grad), with a dynamic batch and dynamic legs sized by the input;
    the program takes the inputs by name. Where the diagram bounds such a leg (`select(x, t, 5)`
    needs t >= 6) the bound is kept; where it fixes one, or torch.export refuses the diagram, a
    PenroseCompileError names the diagram's file.

    >>> import penrose, torch
    >>> m = penrose.compile("dim e = 2\\ninput x[e]\\nparam W[e] ~ ones\\ny = x * W\\noutput y")
    >>> export_program(m).module()(x=torch.full((4, 2), 3.0)).tolist()[0]
    [3.0, 3.0]
    """
    from torch.export.dynamic_shapes import refine_dynamic_shapes_from_suggested_fixes

    inputs = example_inputs(model, batch)
    shapes = dynamic_shapes(model, dynamic_batch)
    try:
        try:
            return _export(model, inputs, shapes)
        except Exception as e:  # a bound on a dynamic leg: torch.export names it ("Suggested fixes"); take it once
            if "Suggested fixes" not in str(e):
                raise
            fixes = str(e).split("Suggested fixes:", 1)[1].strip("\n").split("\n\n", 1)[0]  # up to the blank line
            refined = refine_dynamic_shapes_from_suggested_fixes("Suggested fixes:\n" + fixes, shapes)
            assert isinstance(refined, dict)  # the structure it was given
            fixed = sorted({str(d.__name__) for name, axes in shapes.items() for axis, d in axes.items()
                            if not isinstance(refined[name][axis], torch.export.Dim)})
            if fixed:
                raise PenroseCompileError(f"torch.export cannot keep {', '.join(fixed)} dynamic: the diagram fixes its size "
                                          f"({fixes.strip()})"
                                          + ("; export it with dynamic_batch=False" if BATCH in fixed else ""),
                                          Span(_where(model))) from e
            return _export(model, inputs, refined)
    except PenroseError:
        raise
    except Exception as e:  # torch.export's own errors: a user error here, not a traceback
        raise PenroseCompileError(f"torch.export cannot export this diagram{_op(e)}: {_first_line(e)}", Span(_where(model))) from e


def _export(model: torch.nn.Module, inputs: dict, shapes: dict) -> torch.export.ExportedProgram:
    with torch.no_grad():  # for inference: attention checks the rows a float mask hides (data) only under autograd
        return torch.export.export(model, (), inputs, dynamic_shapes=shapes)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporters' own chatter off (torchvision's absence, torch's deprecation notes, the
    version converter's tracebacks): what goes wrong comes back as an exception."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "onnxscript")]
    levels = [log.level for log in loggers]
    try:
        for log in loggers:
            log.setLevel(logging.CRITICAL + 1)
        with warnings.catch_warnings():
            for category in (FutureWarning, DeprecationWarning):
                warnings.simplefilter("ignore", category)
            warnings.filterwarnings("ignore", module=r"(torch|onnx|onnxscript|onnx_ir)(\.|$)")
            yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def _onnx_modules():
    try:
        import onnx
        import onnxruntime
        import onnxscript  # noqa: F401  (the dynamo exporter's translation library)
    except ImportError as e:
        raise PenroseArgumentError(f"ONNX export needs onnx, onnxscript and onnxruntime ({e.name} is missing): "
                                   f"pip install 'penrose-diagrams[onnx]'") from None
    return onnx, onnxruntime


def export_onnx(source: object = None, out_path: str | os.PathLike[str] | None = None, /, *, seed: int | None = None,
                text: str | None = None, include_paths: Paths = (), sizes: Mapping[str, Any] | None = None, batch: int = 2,
                dynamic_batch: bool = True, opset: int | None = None, verify: bool = True, **more_sizes: Any) -> Path:
    """Write a diagram as an ONNX file; returns its path.

    `source` is a `.pen` path or text (compiled with `seed` and the sizes, as `penrose.compile`
    does) or a module `penrose.compile` made (a trained one: its weights go into the file; a
    zoo model's is `model.diagram`, Steerling's `model.net`). The graph's inputs and outputs
    carry the diagram's names; each input has a leading batch leg, dynamic unless
    `dynamic_batch=False` (then of size `batch`). `opset` picks the ONNX opset (default: the
    exporter's). The file is checked with `onnx.checker` and, with `verify`, run in onnxruntime
    at another batch size and compared with the eager module. Errors are PenroseErrors naming
    the diagram's file (and the operation an exporter refuses); nothing is written then.

    >>> import penrose, tempfile, os
    >>> out = os.path.join(tempfile.mkdtemp(), "double.onnx")
    >>> export_onnx("dim e = 2\\ninput x[e]\\nparam W[e]\\ny = x * W\\noutput y", out).name
    'double.onnx'
    """
    from penrose.io import atomic_write_file, writable_target

    if out_path is None:
        raise PenroseArgumentError("export_onnx needs the .onnx file to write: export_onnx(diagram, 'model.onnx')")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < (2 if dynamic_batch else 1):
        raise PenroseArgumentError(f"batch is the example batch size, a whole number >= {2 if dynamic_batch else 1}, got {batch!r}"
                                   + (" (torch.export fixes a batch of 0 or 1)" if dynamic_batch else ""))
    onnx, _ = _onnx_modules()
    newest = onnx.defs.onnx_opset_version()
    if opset is not None and (not isinstance(opset, int) or isinstance(opset, bool) or not 1 <= opset <= newest):
        raise PenroseArgumentError(f"opset is an ONNX opset from 1 to {newest} (the installed onnx's newest), got {opset!r}")
    writable_target(out_path)  # a bad target is refused before the work
    model = source if isinstance(source, torch.nn.Module) else _compiled(source, seed, text, include_paths, sizes, more_sizes)
    _declared(model)
    size = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    if size >= _TWO_GB:
        raise PenroseArgumentError(f"{size / 2**30:.1f} GiB of weights; one ONNX file holds under 2 GiB "
                                   f"(larger models keep their weights in external data files, which export_onnx does not write)")
    was_training = model.training
    model.eval()  # dropout off, as in any inference export
    try:
        with _quiet():
            onnx_program = _to_onnx(model, batch, dynamic_batch, opset)

            def write(tmp: str) -> None:
                onnx_program.save(tmp, external_data=False)
                try:
                    onnx.checker.check_model(tmp, full_check=True)
                except Exception as e:
                    raise PenroseCompileError(f"the exported ONNX graph does not check: {_first_line(e)}", Span(_where(model))) from e
                if verify:
                    _verify(model, tmp, batch + 1 if dynamic_batch else batch)

            atomic_write_file(out_path, write)
    finally:
        model.train(was_training)
    return Path(out_path)


def _to_onnx(model: torch.nn.Module, batch: int, dynamic_batch: bool, opset: int | None) -> Any:
    """The ONNXProgram of a compiled diagram (inputs and outputs by the diagram's names)."""
    program = export_program(model, batch=batch, dynamic_batch=dynamic_batch)
    _onnx_einsums(program)
    try:
        out = torch.onnx.export(program, f=None, dynamo=True, opset_version=opset, verbose=False,
                                input_names=[s[0] for s in _declared(model)], output_names=_output_names(model),
                                dynamic_shapes=dynamic_shapes(model, dynamic_batch))  # names the dynamic axes only
        assert out is not None  # f=None: the program comes back
    except Exception as e:
        raise PenroseCompileError(f"the ONNX exporter cannot translate this diagram{_op(e)}: {_first_line(e)}",
                                  Span(_where(model))) from e
    got = next((o.version for o in out.model_proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is not None and got != opset:  # the exporter keeps its own opset where it cannot convert, and only logs it
        raise PenroseCompileError(f"the ONNX exporter cannot write this diagram at opset {opset} (it converts from {got}); "
                                  f"leave the opset out, or pick {got} or above", Span(_where(model)))
    return out


def _onnx_einsums(program: torch.export.ExportedProgram) -> None:
    """Drop `...` from each einsum operand it stands for no leg of ('...i,...ik->...k' on a
    weight without batch legs becomes '...i,ik->...k'): torch broadcasts an empty ellipsis, ONNX's
    Einsum refuses ellipses of different lengths (onnxruntime does not load such a graph)."""
    changed = False
    for node in program.graph.nodes:
        if node.target is not torch.ops.aten.einsum.default:
            continue
        equation, operands = node.args[0], node.args[1]
        if "->" not in equation:  # an implicit output: dropping an ellipsis would change it
            continue
        inputs, _, output = equation.replace(" ", "").partition("->")
        terms = inputs.split(",")
        for i, (term, x) in enumerate(zip(terms, operands)):
            value = x.meta.get("val") if hasattr(x, "meta") else None
            if "..." in term and value is not None and value.dim() == len(term) - 3:
                terms[i] = term.replace("...", "")
        if not any("..." in t for t in terms):
            output = output.replace("...", "")
        new = ",".join(terms) + "->" + output
        if new != equation:
            node.args = (new, *node.args[1:])
            changed = True
    if changed:
        program.graph_module.recompile()


def _compiled(source: object, seed: int | None, text: str | None, include_paths: Paths, sizes: Mapping[str, Any] | None,
              more: dict) -> torch.nn.Module:
    from penrose.compiler import compile_diagram

    return compile_diagram(source, seed=seed, text=text, include_paths=include_paths, sizes=sizes, **more)


def _output_names(model: torch.nn.Module) -> list[str] | None:
    checked = getattr(model, "penrose_checked", None)
    return [name for name, _ in checked.outputs] if checked is not None else None


def _verify(model: torch.nn.Module, path: str, batch: int) -> None:
    """Run the ONNX file in onnxruntime on fresh inputs and compare with the eager module."""
    _, onnxruntime = _onnx_modules()
    inputs = example_inputs(model, batch, seed=1)
    if any(x.dtype == torch.bfloat16 for x in inputs.values()):
        raise PenroseArgumentError("numpy, and so onnxruntime's Python API, has no bfloat16: export with verify=False, "
                                   "or the model in float32")
    with torch.no_grad():
        out = model(**inputs)
    expected = [out] if isinstance(out, torch.Tensor) else list(out)
    try:
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        got = session.run(None, {k: v.cpu().numpy() for k, v in inputs.items()})
    except Exception as e:  # onnxruntime's own errors (a node it cannot load or run)
        raise PenroseCompileError(f"onnxruntime cannot run the exported graph: {_first_line(e)}", Span(_where(model))) from e
    names = _output_names(model) or [str(i) for i in range(len(expected))]
    if len(got) != len(expected):
        raise PenroseCompileError(f"the ONNX graph has {len(got)} outputs, the module {len(expected)} ({', '.join(names)})",
                                  Span(_where(model)))
    for name, want, value in zip(names, expected, got):
        value = torch.from_numpy(value)
        if value.shape != want.shape or not torch.allclose(value, want.cpu(), rtol=1e-4, atol=1e-4, equal_nan=True):
            diff = (value - want.cpu()).abs().max().item() if value.shape == want.shape else f"shape {tuple(value.shape)}"
            raise PenroseCompileError(f"the ONNX graph's output {name!r} differs from the module's at batch "
                                      f"{batch} (largest difference {diff})", Span(_where(model)))
