"""Public API arguments are checked (issue 23): seeds, sizes, the params of `interpret` and what
`format_diagram` formats give a clear PenroseError subclass, never torch's RuntimeError, an
OverflowError or an AttributeError."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import penrose
from penrose.interpreter import Interpreter
from penrose import PenroseArgumentError, PenroseCheckError

T = "dim e = 2\ninput x[e]\nparam W[e]\ny = x * W\noutput y\n"


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


@pytest.mark.parametrize("seed", ["abc", 2**70, 2**64, -1, 1.5, 2.0, True, None.__class__, [1]])
def test_bad_seeds(seed):
    with pytest.raises(PenroseArgumentError, match=r"seed must be a whole number from 0 to 2\*\*64 - 1, got"):
        _quiet(penrose.compile, T, seed=seed)
    with pytest.raises(PenroseArgumentError, match="seed must be"):
        Interpreter(T, seed=seed)


@pytest.mark.parametrize("seed", [0, 7, 2**64 - 1, np.int64(3)])
def test_good_seeds_are_deterministic(seed):
    a, b = _quiet(penrose.compile, T, seed=seed), _quiet(penrose.compile, T, seed=seed)
    assert torch.equal(a.W, b.W)


def test_a_bad_seed_is_a_type_and_value_error_too():
    with pytest.raises(TypeError):
        _quiet(penrose.compile, T, seed="abc")
    with pytest.raises(ValueError):
        _quiet(penrose.compile, T, seed=2**70)


@pytest.mark.parametrize("value, why", [("3", "a non-negative integer"), (-1, "a non-negative integer"),
                                        (True, "a non-negative integer"), (2.0, "a non-negative integer"),
                                        (None, "a non-negative integer"), (2**70, "at most 2\\*\\*63 - 1")])
def test_bad_sizes(value, why):
    with pytest.raises(PenroseCheckError, match=f"size for dim 'e' must be {why}, got") as e:
        _quiet(penrose.compile, T, e=value)
    assert e.value.span.line == 1


@pytest.mark.parametrize("params, match", [
    ([1], "params maps state_dict names to tensors \\(a dict, or a module\\), got list"),
    ("abc", "got str"),
    ({"W": "x"}, "'W' maps to a str"),
    ({"W": [1.0, 2.0]}, "'W' maps to a list"),
    ({1: torch.ones(2)}, "params' keys are state_dict names, got 1"),
])
def test_bad_params_of_interpret(params, match):
    with pytest.raises(PenroseArgumentError, match=match):
        _quiet(penrose.interpret, T, torch.ones(2), params=params)


def test_bad_training_flag():
    with pytest.raises(PenroseArgumentError, match="training must be True or False"):
        _quiet(penrose.interpret, T, torch.ones(2), training="yes")


@pytest.mark.parametrize("value", ["dim e = 2\ninput x[e]\noutput x", 3, None, b"dim e = 2"])
def test_format_diagram_takes_a_diagram(value):
    with pytest.raises(PenroseArgumentError, match="format_diagram takes a parsed Diagram"):
        penrose.format_diagram(value)
    text = "dim e = 2\ninput x[e]\noutput x"
    assert penrose.format_diagram(penrose.parse(text)) == text + "\n"
