"""One meaning at run time (issue 23): the compiled module, the standalone source and the
interpreter agree on every input, bad ids and bad calls included, in value and error class.

gather's id -1 wrapped to the last row in the interpreter and was torch's IndexError in the
module; uint8 ids were a bool mask to the interpreter (shape (2, 2)) and indices to the module
(shape (4, 2)); `model(x, ids, x=x)` was Python's TypeError in the module.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import penrose
from penrose.errors import PenroseShapeError

GATHER = "dim v = 4, e = 2, t\ninput ids[t] : int\nparam E[v, e]\ny = gather(E, ids)\noutput y\n"
GATHER3 = "dim v = 4, e = 2, f = 3, t\ninput ids[t] : int\nparam E[v, e, f]\ny = gather(E, ids)\noutput y\n"
SELECT = "dim t, e = 2\ninput x[t, e]\ny = select(x, t, 2)\noutput y\n"
SELECT_NEG = "dim t, e = 2\ninput x[t, e]\ny = select(x, t, -3)\noutput y\n"
SLICE = "dim t, e = 2, s = 2\ninput x[t, e]\ny = slice(x, t, -3, s)\noutput y\n"


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def three(text):
    """(name, callable) for the compiled module, the standalone source and the interpreter,
    all with the module's parameters."""
    module = _quiet(penrose.compile, text, seed=0)
    ns = {"__name__": "penrose_one_meaning"}
    exec(compile(_quiet(penrose.source, text), "<standalone>", "exec"), ns)
    standalone = ns["Model"]()
    standalone.load_state_dict(module.state_dict())
    state = module.state_dict()
    return [("module", module), ("standalone", standalone),
            ("interpreter", lambda *a, **k: _quiet(penrose.interpret, text, *a, params=state, **k))]


def outcomes(text, *args, **kwargs):
    out = []
    for name, fn in three(text):
        try:
            out.append((name, fn(*args, **kwargs)))
        except Exception as e:  # noqa: BLE001 - the class is what is compared
            out.append((name, e))
    return out


def assert_same_error(text, pattern, *args, **kwargs):
    for name, got in outcomes(text, *args, **kwargs):
        assert isinstance(got, ValueError) and type(got).__name__ in ("PenroseShapeError", "ShapeError"), (name, got)
        assert pattern in str(got), (name, str(got))
        if name != "standalone":
            assert isinstance(got, PenroseShapeError)


@pytest.mark.parametrize("text", [GATHER, GATHER3], ids=["embedding", "indexing"])
@pytest.mark.parametrize("ids, bad", [([-1, 2], -1), ([0, 4], 4), ([7, -2], -2)])
def test_gather_ids_out_of_range(text, ids, bad):
    assert_same_error(text, f"gather: input 'ids' indexes leg 'v' of 'E': id {bad} is outside 0 to 3",
                      torch.tensor(ids))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bool, torch.float32, torch.int16])
def test_gather_ids_of_other_dtypes(dtype):
    assert_same_error(GATHER, f"input 'ids' must hold integer ids, got {dtype}", torch.tensor([1, 0]).to(dtype))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_gather_good_ids_agree(dtype):
    results = outcomes(GATHER, torch.tensor([3, 0, 3], dtype=dtype))
    want = results[0][1]
    assert want.shape == (3, 2)
    for name, got in results:
        torch.testing.assert_close(got, want, msg=name)


def test_ids_computed_in_the_diagram_are_checked_too():
    text = "dim v = 4, e = 2, t = 2\ninput x[t] : int\nparam E[v, e]\ny = gather(E, x)\nz = gather(E, x)\noutput y, z\n"
    assert_same_error(text, "id 9 is outside 0 to 3", torch.tensor([9, 0]))


def test_select_and_slice_on_a_run_time_size():
    assert_same_error(SELECT, "select of leg 't': index 2 outside a leg of size 2", torch.ones(2, 2))
    assert_same_error(SELECT_NEG, "select of leg 't': index -3 outside a leg of size 2", torch.ones(2, 2))
    assert_same_error(SLICE, "slice of leg 't': indices -3 to -2 outside a leg of size 2", torch.ones(2, 2))
    # negative indices inside the leg count from the end, the same in all three
    x = torch.arange(8.0).reshape(4, 2)
    for text, want in ((SELECT_NEG, x[1]), (SLICE, x[1:3]), (SELECT, x[2])):
        for name, got in outcomes(text, x):
            torch.testing.assert_close(got, want, msg=f"{name}: {text}")


TWO = "dim t = 2, e = 2\ninput x[t, e]\ninput ids[t] : int\nparam E[t, e]\ny = x + gather(E, ids)\noutput y\n"


@pytest.mark.parametrize("call, pattern", [
    (lambda x, ids: ((x, ids), {"x": x}), "input 'x' given twice"),
    (lambda x, ids: ((x,), {"x": x, "ids": ids}), "input 'x' given twice"),
    (lambda x, ids: ((x,), {}), "missing input 'ids'"),
    (lambda x, ids: ((), {"ids": ids}), "missing input 'x'"),
    (lambda x, ids: ((x, ids), {"z": x}), "unexpected input"),
    (lambda x, ids: ((x, ids, x), {}), "3 positional inputs given but the diagram takes 2"),
], ids=["twice", "twice-by-name", "missing", "missing-first", "unknown", "too-many"])
def test_bad_calls_are_one_error_class(call, pattern):
    args, kwargs = call(torch.ones(2, 2), torch.tensor([0, 1]))
    assert_same_error(TWO, pattern, *args, **kwargs)


def test_good_calls_agree():
    x, ids = torch.randn(2, 2), torch.tensor([1, 0])
    for args, kwargs in (((x, ids), {}), ((x,), {"ids": ids}), ((), {"ids": ids, "x": x})):
        results = outcomes(TWO, *args, **kwargs)
        for name, got in results:
            torch.testing.assert_close(got, results[0][1], msg=name)


def test_ids_on_the_meta_device_are_not_read():
    """A module built on the meta device (parameter counts, shapes) holds no id values to
    check: gather runs there as before (the Steerling parameter-count test)."""
    module = _quiet(penrose.compile, GATHER, seed=0)
    with torch.device("meta"):
        out = module.to("meta")(torch.tensor([0, 9], device="meta"))
    assert out.shape == (2, 2) and out.is_meta
