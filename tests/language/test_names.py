"""Names: a diagram that checks compiles, and its standalone source imports and runs (issue 23).

Every identifier the compiler emits meets one table of what Python and the generated module
reserve (penrose.tables.RESERVED, `reserved`): a user name that would collide is refused by the
checker at its position, or renamed in the generated code while users keep their names (an
input named `extra` is still called `extra=`, a param named `Outputs` keeps its state-dict name).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import uuid
import warnings
from pathlib import Path

import pytest
import torch

import penrose
from penrose.compiler import generate_source, write_source
from penrose.errors import PenroseCheckError, PenroseError, PenroseShapeError
from penrose.interpreter import Interpreter
from penrose.tables import GENERATED, RESERVED, reserved

from program_strategies import candidate_names

REDUCED = os.environ.get("PENROSE_REDUCED", "") not in ("", "0")


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def import_file(path: Path):
    """Import a standalone source file under a fresh module name."""
    spec = importlib.util.spec_from_file_location(f"pen_names_{uuid.uuid4().hex}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def checks_compiles_imports(source, tmp_path: Path, **inputs):
    """check ok ⇒ compile ok ⇒ the standalone file imports and gives the module's numbers;
    returns (module, standalone module)."""
    quiet(penrose.load, source)
    module = quiet(penrose.compile, source, seed=0)
    out = tmp_path / f"gen_{uuid.uuid4().hex}.py"
    quiet(write_source, source, out)
    standalone = import_file(out).Model()
    standalone.load_state_dict(module.state_dict())
    a, b = module(**inputs), standalone(**inputs)
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        torch.testing.assert_close(x, y)
    return module, standalone


# ---- the cases of the issue ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["extra", "unexpected"])
def test_input_named_like_the_catch_alls(name, tmp_path):
    """`input extra[e]` checked ok, then compile raised SyntaxError: duplicate argument 'extra'
    and `penrose compile -o` wrote `def forward(self, extra=None, *extra, ...)`."""
    text = f"dim e = 4\ninput {name}[e]\nres = {name} * 2\noutput res\n"
    x = torch.arange(4.0)
    module, standalone = checks_compiles_imports(text, tmp_path, **{name: x})
    assert torch.equal(module(x), 2 * x)  # positional and by its own keyword
    assert torch.equal(quiet(penrose.interpret, text, **{name: x}), 2 * x)
    with pytest.raises(PenroseShapeError, match="unexpected input"):
        module(**{name: x, "other": x})
    with pytest.raises(PenroseShapeError, match="positional inputs"):
        module(x, x)


@pytest.mark.parametrize("stem, cls", [("none", "NoneModel"), ("True", "TrueModel"), ("False", "FalseModel"),
                                       ("shape_error", "ShapeErrorModel"), ("model", "ModelModel"),
                                       ("value_error", "ValueErrorModel"), ("Exception", "ExceptionModel"),
                                       ("torch", "Torch"), ("print", "Print")])
def test_file_names_that_are_python_or_generated_names(stem, cls, tmp_path):
    """none.pen compiled to `class None(torch.nn.Module)`; shape_error.pen to a class that
    replaced the runtime's ShapeError, so a wrong input raised a TypeError."""
    path = tmp_path / f"{stem}.pen"
    path.write_text("dim e = 4\ninput x[e]\nparam W[e]\nres = x * W\noutput res\n", encoding="utf-8")
    module, standalone = checks_compiles_imports(str(path), tmp_path, x=torch.ones(4))
    assert type(module).__name__ == cls and type(standalone).__name__ == cls
    # a wrong input is the runtime's ShapeError (a ValueError), not a TypeError
    with pytest.raises(PenroseShapeError, match="must have size 4"):
        module(torch.ones(3))
    with pytest.raises(ValueError, match="must have size 4") as e:
        standalone(torch.ones(3))
    assert type(e.value).__name__ == "ShapeError"


def test_cli_compile_of_a_reserved_file_name_imports(tmp_path):
    path = tmp_path / "False.pen"
    path.write_text("dim e = 4\ninput extra[e]\nres = extra * 2\noutput res\n", encoding="utf-8")
    out = tmp_path / "false_model.py"
    run = subprocess.run([sys.executable, "-m", "penrose.cli", "compile", str(path), "-o", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    mod = import_file(out)
    assert torch.equal(mod.Model()(extra=torch.ones(4)), torch.full((4,), 2.0))


@pytest.mark.parametrize("dims", [("dtype",), ("sizes", "sizes_size"), ("device", "split"), ("extra", "unexpected"),
                                  ("sizes_size", "sizes")])
def test_free_dims_named_like_generated_locals(dims, tmp_path):
    """A free dim `dtype` gave a local `_dtype` that the dtype of where() then overwrote (a
    TypeError); dims `sizes` and `sizes_size` both gave `_sizes_size`."""
    legs = ", ".join(dims)
    sizes_sum = " + ".join(dims)
    text = (f"dim {', '.join(dims)}\ninput x[{legs}]\n"
            f"y = where(x > 0, 1, 0) * ({sizes_sum})\nz = y + x\noutput z\n")
    shape = tuple(range(2, 2 + len(dims)))
    x = torch.randn(shape)
    module, _ = checks_compiles_imports(text, tmp_path, x=x)
    want = torch.where(x > 0, 1.0, 0.0) * sum(shape) + x
    torch.testing.assert_close(module(x), want)
    torch.testing.assert_close(quiet(penrose.interpret, text, x=x), want)


def test_param_named_outputs_keeps_its_state_dict_name(tmp_path):
    """`param Outputs[e]` replaced the class's named tuple of outputs (KeyError)."""
    text = "dim e = 3\ninput x[e]\nparam Outputs[e]\ny = x * Outputs\nz = y * 2\noutput y, z\n"
    module, standalone = checks_compiles_imports(text, tmp_path, x=torch.ones(3))
    assert list(module.state_dict()) == ["Outputs"]
    out = module(torch.ones(3))
    assert type(out)._fields == ("y", "z")


def test_entry_outputs_attribute_and_a_param_of_its_name(tmp_path):
    full = "dim e = 3\ninput x[e]\nparam HiddenOutputs[e]\ny = x * HiddenOutputs\nz = y * 2\noutput y, z\n"
    hidden = "dim e = 3\ninput x[e]\nparam HiddenOutputs[e]\nh = x * HiddenOutputs\ng = h + 1\noutput h, g\n"
    module = quiet(penrose.compile, full, entries={"hidden": hidden})
    assert type(module.hidden(torch.ones(3)))._fields == ("h", "g")
    assert list(module.state_dict()) == ["HiddenOutputs"]


# ---- the table -----------------------------------------------------------------------------------


def test_the_table_says_why():
    assert reserved("None", "class") == "a Python keyword"
    assert reserved("ShapeError", "class") == "a name the generated module defines"
    assert reserved("ValueError", "class") == "a Python builtin"
    assert reserved("_extra", "local") is not None and reserved("extra", "local") is None
    assert reserved("Outputs", "attribute") is None  # the compiler moves the named tuple aside
    assert reserved("Outputs", "method") is not None and reserved("training", "attribute") is not None
    assert reserved("forward", "method") is not None


def test_names_methods_read_are_refused_as_tensor_names():
    """A local named like what a generated method reads (torch, self, abs) would shadow it: the
    checker refuses each (as reserved, or as a function of the language)."""
    from penrose.tables import FUNCTIONS

    for name in RESERVED["module"] | RESERVED["method"]:
        assert name in GENERATED or name in FUNCTIONS, name
        with pytest.raises(PenroseCheckError) as e:
            quiet(penrose.load, f"dim e = 2\ninput x[e]\n{name} = x * 2\noutput {name}")
        assert e.value.span.line == 3 and e.value.span.col == 1


ROLES = {  # a program using the name in one role each
    "input": "dim e = 2\ninput {n}[e]\ny = {n} * 2\noutput y",
    "local": "dim e = 2\ninput x[e]\n{n} = x * 2\noutput {n}",
    "param": "dim e = 2\ninput x[e]\nparam {n}[e]\ny = x * {n}\noutput y",
    "block": "dim e = 2\nblock {n}(a[e]) {{\n  b = a * 2\n  return b\n}}\ninput x[e]\ny = {n}(x)\noutput y",
    "formal": "dim e = 2\nblock f({n}[e]) {{\n  b = {n} * 2\n  return b\n}}\ninput x[e]\ny = f(x)\noutput y",
    "instance": "dim e = 2\nblock f(a[e]) {{\n  param P[e]\n  b = a * P\n  return b\n}}\ninput x[e]\ny = f(x) as {n}\noutput y",
    "dim": "dim {n}\ninput x[{n}]\ny = x * {n}\noutput y",
    "output": "dim e = 2\ninput x[e]\n{n} = x * 2\nz = x + 1\noutput {n}, z",
}


@pytest.mark.slow
def test_every_hostile_name_in_every_role_is_refused_or_compiles():
    """Python's keywords and builtins, the run-time helpers' names, torch's attribute names and
    the generated names, in every role: the checker refuses the name at a position, or the
    generated source compiles (Python's compile() of the standalone file) and runs."""
    compiled = 0
    names = candidate_names()
    for n in names[::5] if REDUCED else names:
        for role, template in ROLES.items():
            text = template.format(n=n)
            try:
                checked = quiet(penrose.load, text)
            except PenroseError as e:
                assert e.span is not None and e.span.line >= 1, (n, role, str(e))
                continue
            source = generate_source(checked, standalone=True)
            compile(source, f"<{role} {n}>", "exec")  # a SyntaxError fails the test
            compiled += 1
    assert compiled > len(names) // (5 if REDUCED else 1)  # most names are fine somewhere


@pytest.mark.parametrize("n", ["extra", "unexpected", "Outputs", "dtype", "sizes", "print", "Exception", "Model", "values"])
@pytest.mark.parametrize("role", sorted(ROLES))
def test_hostile_names_run_in_every_role(n, role, tmp_path):
    text = ROLES[role].format(n=n)
    try:
        quiet(penrose.load, text)
    except PenroseCheckError:
        return  # refused at a position: the previous test asserts that
    module, _ = checks_compiles_imports(text, tmp_path, **{("x" if role != "input" else n): torch.ones(2)})
    # the Interpreter's call takes inputs only (penrose.interpret also takes sizes=, params=, ...)
    interp = quiet(lambda: Interpreter(text, params=module.state_dict())(**{("x" if role != "input" else n): torch.ones(2)}))
    a = module(**{("x" if role != "input" else n): torch.ones(2)})
    for x, y in zip(a if isinstance(a, tuple) else (a,), interp if isinstance(interp, tuple) else (interp,)):
        torch.testing.assert_close(x, y)
