"""`%load_ext penrose` and `%%pen`: in a real Jupyter kernel (nbclient executes a small notebook),
and in IPython's own shell for the options and the errors."""

from __future__ import annotations

import shutil

import pytest

from penrose.magic import PenCellError, _options, run_cell

DIAGRAM = """\
# index legend: t token, e embedding
dim t = 16, e = 8
input x[t, e]
param W[e, e]
y = einsum('te,ef->tf', x, W)
output y"""

BROKEN = """\
dim e = 2
input x[e]
y = relu(z)
output y"""

has_dot = shutil.which("dot") is not None


def test_a_notebook_in_a_real_kernel():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext penrose"),
        nbformat.v4.new_code_cell("%%pen model --size t=4 --seed 0\n" + DIAGRAM),
        nbformat.v4.new_code_cell("import torch\nprint(type(model).__name__, tuple(model(torch.randn(4, 8)).shape))"),
        nbformat.v4.new_code_cell("%%pen\n" + BROKEN),
        nbformat.v4.new_code_cell("print('not reached')"),
    ]
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3")
    with pytest.raises(nbclient.exceptions.CellExecutionError):
        client.execute()  # the broken cell stops the run, as an error should
    load, pen, use, broken, after = nb.cells
    assert [o["output_type"] for o in load.outputs] == []
    if has_dot:
        (figure,) = pen.outputs
        assert figure["output_type"] == "display_data" and "<svg" in figure["data"]["image/svg+xml"]
    assert use.outputs[0]["text"].strip().endswith("(4, 8)")
    (err,) = broken.outputs
    assert err["output_type"] == "error" and err["ename"] == "PenCellError"
    text = "\n".join(err["traceback"])
    assert "<pen cell>:3:10: error: unknown tensor 'z'" in text
    assert "    y = relu(z)\n             ^" in text and "Traceback" not in text
    assert after.outputs == []


@pytest.fixture(scope="module")
def ip():
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "penrose")
    return shell


def test_the_shell_binds_the_module_and_shows_the_figure(ip):
    shown = []
    ip.display_pub.publish = lambda data, metadata=None, **kw: shown.append(data)
    try:
        ip.run_cell_magic("pen", "net --size t=4 --seed 1", DIAGRAM)
    finally:
        del ip.display_pub.publish
    import torch

    net = ip.user_ns["net"]
    assert isinstance(net, torch.nn.Module) and net(torch.randn(4, 8)).shape == (4, 8)
    if has_dot:  # a terminal shell asks for text only; a notebook gets the SVG (above)
        assert any(d.get("text/plain", "").startswith("<penrose figure: ") or "image/svg+xml" in d for d in shown)


def test_a_broken_cell_is_an_error_with_its_caret(ip):
    result = ip.run_cell("%%pen bad\n" + BROKEN)
    assert isinstance(result.error_in_exec, PenCellError)
    assert result.error_in_exec._render_traceback_()[1:] == ["    y = relu(z)", "             ^"]
    assert "bad" not in ip.user_ns


def test_options():
    assert _options("model --size t=64 --size alpha=0.5 --seed 3 --no-figure --source --include-path lib") == {
        "name": "model", "sizes": {"t": 64, "alpha": 0.5}, "seed": 3, "include_paths": ["lib"], "figure": False, "source": True}
    assert _options("--size=t=8")["sizes"] == {"t": 8}
    for bad, why in (("--size", "needs a value"), ("--size t=x", "NAME=NUMBER"), ("--bogus", "unknown option"),
                     ("1x", "not a Python name"), ("a b", "one name"), ("--seed x", "integer")):
        with pytest.raises(Exception, match=why):
            _options(bad)


def test_run_cell_without_ipython():
    ns, shown = {}, []
    checked = run_cell("--no-figure", DIAGRAM, ns, shown.append)
    assert ns == {} and checked.outputs[0][0] == "y" and shown == []
    run_cell("m --no-figure --source", DIAGRAM, ns, shown.append)
    assert "m" in ns and "class Diagram" in repr(shown[-1])
    with pytest.raises(PenCellError, match="unknown dim 'q' in sizes"):
        run_cell("--size q=3", DIAGRAM, ns)
    shown.clear()
    run_cell("--no-figure", "dim e = 2\ninput x[e]\ninput unused[e]\noutput x", ns, shown.append)
    assert "warning: input 'unused' is never used" in repr(shown[0])
