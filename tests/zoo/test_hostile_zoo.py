"""Hostile arguments and files for the zoo (docs/security.md, "The zoo's training and data"): every
one a project error naming the argument, the tensor or the file (PenroseArgumentError,
InterventionError, DataError), never a traceback from inside torch or NumPy, never a run that
returns normally with garbage (NaN parameters, gradient ascent, a negative loss)."""

from __future__ import annotations

import io
import os
import struct
import zipfile

import numpy as np
import pytest
import torch

import penrose_zoo
from penrose.errors import PenroseArgumentError
from penrose_zoo.core import InterventionError
from penrose_zoo.data import DataError, load_concept_arrays, toy_concepts
from penrose_zoo.interventions import FixedValue, OrderPolicy, Quantile, RandomPolicy, intervention_curve
from penrose_zoo.train import fit
from penrose_zoo.validate import cli_whole, json_text, number, printable, whole

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data():
    return toy_concepts("xor", n=100, seed=0)


@pytest.fixture
def cbm():
    return penrose_zoo.ConceptBottleneckModel(f=2, k=2, r=2)


FIT = dict(epochs=1, batch_size=32, lr=1e-2, progress=False)


# ---- fit's arguments --------------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    ({"lr": float("nan")}, "lr must be a finite number of at least 0, got nan"),  # issue 37: every parameter NaN
    ({"lr": -0.01}, "lr must be a finite number of at least 0, got -0.01"),  # gradient ascent
    ({"lr": "0.01"}, r"lr must be a finite number of at least 0, got '0.01' \(str\)"),
    ({"grad_clip": -1.0}, "grad_clip must be a finite number above 0, got -1.0"),  # clipping by a negative norm
    ({"grad_clip": 0.0}, "grad_clip must be a finite number above 0, got 0.0"),  # every gradient zeroed
    ({"weight_decay": float("inf")}, "weight_decay must be a finite number of at least 0, got inf"),
    ({"epochs": 2.0}, r"epochs must be a whole number of at least 0, got 2.0 \(float\)"),  # range() would fail later
    ({"epochs": -1}, "epochs must be a whole number of at least 0, got -1"),
    ({"batch_size": True}, r"batch_size must be a whole number of at least 1, got True \(bool\)"),
    ({"batch_size": 0}, "batch_size must be a whole number of at least 1, got 0"),
    ({"val_every": 0}, "val_every must be a whole number of at least 1, got 0"),
    ({"seed": -1}, "seed must be a whole number from 0 to 2\\*\\*64 - 1, got -1"),
    ({"optimizer": "rmsprop"}, "optimizer must be one of 'adam', 'adamw', 'sgd', an Optimizer or a factory; got 'rmsprop'"),
    ({"optimizer": ["adam"]}, r"optimizer must be one of .*; got \['adam'\]"),  # unhashable: no TypeError from a dict
    ({"progress": "no"}, "progress must be True or False, got 'no'"),
    ({"metric_fn": 3}, "metric_fn must be callable or None, got int"),
])
def test_fit_arguments_are_named(data, cbm, change, message):
    before = [p.detach().clone() for p in cbm.parameters()]
    with pytest.raises(PenroseArgumentError, match=message):
        cbm.fit(data.train_tuple(), **{**FIT, **change})
    assert all(torch.equal(a, b) for a, b in zip(before, cbm.parameters()))  # refused before any step


def test_fit_refuses_a_loss_function_that_is_not_one(data, cbm):
    with pytest.raises(PenroseArgumentError, match="loss_fn must be callable, got str"):
        fit(cbm, "joint", data.train_tuple(), **FIT)


def test_val_data_of_other_roles_is_refused_before_training(data, cbm):
    # regression: (x, c, y) training with (x, c) validation failed in the loss after a whole epoch
    with pytest.raises(PenroseArgumentError, match="val_data holds 2 tensors, train_data 3"):
        fit(cbm, cbm.loss_fn(), data.train_tuple(), data.val_tuple()[:2], **FIT)  # any model's loop
    with pytest.raises(PenroseArgumentError, match=r"val_data must be \(x, c, y\) for ConceptBottleneckModel"):
        cbm.fit(data.train_tuple(), data.val_tuple()[:2], **FIT)


def test_a_model_with_nothing_to_train_is_named(data, cbm):
    cbm.requires_grad_(False)
    with pytest.raises(PenroseArgumentError, match="no trainable parameters"):
        fit(cbm, cbm.loss_fn(), data.train_tuple(), optimizer="sgd", **FIT)


# ---- labels against the task and the concept types --------------------------------------------

def test_concept_labels_outside_0_1_are_refused(data, cbm):
    x, c, y = data.train_tuple()
    # issue 37: labels {0, 3} drove the concept BCE below zero
    with pytest.raises(PenroseArgumentError, match=r"c_train \(train_data\[1\]\) holds 3.0 at index \(\d+, \d\): "
                                                   r"concept column \d \('C\d'\) is binary, its labels are 0 to 1"):
        penrose_zoo.ConceptBottleneckModel(f=2, k=2, r=2, concept_names=("C1", "C2")).fit((x, c * 3, y), **FIT)
    with pytest.raises(PenroseArgumentError, match=r"c_val \(val_data\[1\]\) holds -1.0"):
        cbm.fit((x, c, y), (x, c - 1, y), **FIT)


@pytest.mark.parametrize("task, r, labels, message", [
    ("multiclass", 2, lambda y: y + 5, r"y_train \(train_data\[2\]\) holds \d at index \(0,\); a multiclass task's labels are class ids 0..1"),
    ("multiclass", 2, lambda y: y.float() / 2, r"holds 0.5 at index \(\d+,\); a multiclass task's labels are class ids 0..1"),
    ("binary", 1, lambda y: y * 3, r"holds 3 at index \(\d+,\); a binary task's labels are 0 or 1"),  # issue 37's -17 loss
    ("binary", 1, lambda y: y.float() - 1, r"holds -1.0 at index"),
])
def test_task_labels_are_checked_against_the_task(data, task, r, labels, message):
    x, c, y = data.train_tuple()
    model = penrose_zoo.ConceptBottleneckModel(f=2, k=2, r=r, task=task)
    with pytest.raises(PenroseArgumentError, match=message):
        model.fit((x, c, labels(y)), **FIT)


def test_soft_labels_and_nan_are_left_to_their_own_rules(data, cbm):
    x, c, y = data.train_tuple()
    cbm.fit((x, c * 0.5, y), **FIT)  # probabilities are labels a BCE reads
    from penrose_zoo.train import NonFiniteInputError

    bad = c.clone()
    bad[3, 1] = float("inf")
    with pytest.raises(NonFiniteInputError, match=r"has inf at index \(3, 1\)"):  # named as before, not as a label
        cbm.fit((x, bad, y), **FIT)


@pytest.mark.parametrize("model, batch, message", [
    # regression: the loss failed to unpack the batch at the first step ("not enough values to unpack")
    (lambda: penrose_zoo.ConceptBottleneckModel(f=2, k=2), lambda x, c, y: (x, y),
     r"train_data must be \(x, c, y\) for ConceptBottleneckModel, got 2 tensors"),
    (lambda: penrose_zoo.LinearModel(f=2, r=2, task="multiclass"), lambda x, c, y: (x, c, y),
     r"train_data must be \(x, y\) for LinearModel, got 3 tensors"),
    (lambda: penrose_zoo.SelfAttention(), lambda x, c, y: (x,), r"train_data must be \(Z, target, weight\)"),
])
def test_batches_of_the_wrong_form(data, model, batch, message):
    with pytest.raises(PenroseArgumentError, match=message):
        model().fit(batch(*data.train_tuple()), **FIT)


def test_a_binary_target_as_a_column(data):
    x, _, y = data.train_tuple()  # regression: BCE's "Target size ([32, 1]) must be the same as input size ([32])"
    penrose_zoo.LinearModel(f=2, r=1, task="binary").fit((x, y[:, None].float()), **FIT)


def test_a_classifier_without_concepts_checks_its_task_labels(data):
    x, _, y = data.train_tuple()
    with pytest.raises(PenroseArgumentError, match=r"y_train \(train_data\[1\]\) holds \d at index"):  # not an IndexError
        penrose_zoo.LinearModel(f=2, r=3, task="multiclass").fit((x, y + 7), **FIT)


def test_typed_concepts_check_each_column_by_its_type(data):
    x, _, y = data.train_tuple()
    model = penrose_zoo.TypedConceptBottleneckModel(f=2)  # c0, c1 binary; c2 a/b/c categorical; c3 continuous
    c = torch.zeros(len(x), 6)
    c[:, 2] = 1
    c[:, 5] = 40.0  # continuous: any finite value
    model.fit((x, c, y), **FIT)
    two = c.clone()
    two[4, 3] = 1
    with pytest.raises(PenroseArgumentError, match=r"columns \[2, 3, 4\] \('c2=a', 'c2=b', 'c2=c'\) of a categorical "
                                                   r"concept sum to 2 in row \(4,\); a categorical concept takes one value"):
        model.fit((x, two, y), **FIT)
    unlabelled = c.clone()
    unlabelled[:5, 2] = 0  # no value of c2 for five rows: their loss for it is 0
    model.fit((x, unlabelled, y), **FIT)
    with pytest.raises(PenroseArgumentError, match=r"concept column 0 \('c0'\) is binary"):
        model.fit((x, c - 2 * (torch.arange(6) == 0), y), **FIT)


def test_cav_probes_check_their_concept_labels(data):
    x, c, y = data.train_tuple()
    model = penrose_zoo.ConceptActivationVectors(d=2, k=2, j=1, r=2)
    with pytest.raises(PenroseArgumentError, match=r"c_train \(train_data\[1\]\) holds 2.0"):
        model.fit_probes((x, c * 2), **FIT)


@pytest.mark.parametrize("kw, message", [
    ({"k": 0}, "a concept model needs at least one concept, got k = 0"),  # a bottleneck of nothing trained silently
    ({"concept_weight": "a"}, "concept_weight must be a number, one per concept or a dict of them by name, got 'a'"),
    ({"concept_weight": {"c0": "x"}}, "concept_weight must be a number"),  # was float()'s own ValueError
    ({"concept_names": "ab"}, "concept_names must be a list of non-empty strings, got 'ab'"),
    ({"k": 2, "concept_names": ["a", "a"]}, r"concept_names must be distinct, got \['a', 'a'\]"),
])
def test_concept_model_arguments(kw, message):
    with pytest.raises(PenroseArgumentError, match=message):
        penrose_zoo.ConceptBottleneckModel(f=2, **kw)


def test_typed_concept_weights_and_values(data, trained):
    with pytest.raises(PenroseArgumentError, match=r"concept_weight for 'c1' must be a finite number of at least 0, got 'a'"):
        penrose_zoo.TypedConceptBottleneckModel(f=2, concept_weight=[1, "a", 2, 3])
    x = data.val_tuple()[0][:2]
    with pytest.raises(InterventionError, match=r"intervention values must be numbers .*, got \['high'\]"):
        trained.intervene(x, [0], ["high"])
    with pytest.raises(PenroseArgumentError, match=r"evaluate's data must be \(x, c, y\), got tuple of 2"):
        trained.evaluate(data.val_tuple()[:2])


def test_p_int_must_be_a_probability():
    with pytest.raises(PenroseArgumentError, match=r"p_int must be a finite number from 0 to 1, got '0.5' \(str\)"):
        penrose_zoo.ConceptBottleneckModel(f=2, k=2, p_int="0.5")


# ---- interventions ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(data):
    model = penrose_zoo.ConceptBottleneckModel(f=2, k=2, r=2)
    model.fit(data.train_tuple(), **FIT)
    return model


@pytest.mark.parametrize("value, message", [
    (float("inf"), "FixedValue holds a value that is not finite: inf"),  # issue 37: `intervene` refuses it, the curve took it
    ([1.0, float("nan")], "not finite at index 1"),
    ("high", "FixedValue needs a number or a list of numbers"),
    (True, "FixedValue needs a number"),
    ([[1.0, 2.0]], "FixedValue needs a number or a list of numbers"),
])
def test_fixed_values_must_be_finite_numbers(value, message):
    with pytest.raises(InterventionError, match=message):
        FixedValue(value)


def test_policies_by_name(data, trained):
    # issue 37: a policy given by name raised AttributeError ('str' object has no attribute 'ranking')
    curve = intervention_curve(trained, data.val_tuple(), policy="uncertainty")
    assert curve.policy == "uncertainty" and curve.accuracy[-1] == intervention_curve(trained, data.val_tuple()).accuracy[-1]
    with pytest.raises(PenroseArgumentError, match=r"'order' needs its argument: OrderPolicy\(\[...\]\)"):
        intervention_curve(trained, data.val_tuple(), policy="order")
    with pytest.raises(PenroseArgumentError, match="policy must be a Policy or one of the names 'random', 'uncertainty', "
                                                   "'gradient', got 3"):
        intervention_curve(trained, data.val_tuple(), policy=3)
    with pytest.raises(PenroseArgumentError, match="strategy must be a Strategy or one of the names 'ground truth'"):
        intervention_curve(trained, data.val_tuple(), strategy="truth")


@pytest.mark.parametrize("kw, message", [
    ({"fractions": [0.0, 2.0]}, r"fractions\[1\] must be a finite number from 0 to 1, got 2.0"),
    ({"fractions": [float("nan")]}, r"fractions\[0\] must be a finite number from 0 to 1, got nan"),
    ({"fractions": []}, "fractions must be a non-empty list of numbers"),
    ({"fractions": 0.5}, "fractions must be a non-empty list"),
])
def test_curve_fractions(data, trained, kw, message):
    with pytest.raises((InterventionError, PenroseArgumentError), match=message):
        intervention_curve(trained, data.val_tuple(), **kw)


def test_curve_labels_are_checked_as_trainings(data, trained):
    x, c, y = data.val_tuple()  # regression: a ground-truth intervention set concepts to 3, accuracy compared with 7
    with pytest.raises(PenroseArgumentError, match=r"data\[1\] \(c\) holds 3.0 at index \(\d+, \d\): concept column"):
        intervention_curve(trained, (x, c * 3, y))
    with pytest.raises(PenroseArgumentError, match=r"data\[2\] \(y\) holds \d at index \(0,\); a multiclass task's labels"):
        intervention_curve(trained, (x, c, y + 7))


def test_curve_data_and_policy_arguments(data, trained):
    with pytest.raises(PenroseArgumentError, match=r"data must be \(x, c, y\) tensors, got tuple"):
        intervention_curve(trained, data.val_tuple()[:2])
    with pytest.raises(PenroseArgumentError, match="OrderPolicy's order must be a list of concept ids or names, got 'C1'"):
        OrderPolicy("C1")  # a string would be read letter by letter
    with pytest.raises(PenroseArgumentError, match="seed must be a whole number"):
        RandomPolicy(-1)
    with pytest.raises(PenroseArgumentError, match=r"Quantile q must be a finite number from 0.5 to 1, got '0.9' \(str\)"):
        Quantile("0.9")
    x = data.val_tuple()[0].clone()
    x[0, 0] = float("nan")
    with pytest.raises(InterventionError, match="not all finite"):
        Quantile().fit(trained, x)
    curve = intervention_curve(trained, data.val_tuple(), fractions=torch.linspace(0, 1, 3))  # 0-d tensors are numbers
    assert curve.fractions == (0.0, 0.5, 1.0)


# ---- load_concept_arrays: .npz files as untrusted input ----------------------------------------

def _rows(n=40):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 3)), (rng.random((n, 2)) > 0.5).astype(float), (rng.random(n) > 0.5).astype(int)


def _npy(header: str, data: bytes = b"") -> bytes:
    """A .npy member with this header dict (format 1.0)."""
    text = header + " " * (118 - len(header)) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1") + data


def _zip(path, members: dict[str, bytes]):
    with zipfile.ZipFile(path, "w") as z:
        for name, blob in members.items():
            z.writestr(name, blob)
    return path


def _saved(**arrays) -> dict[str, bytes]:
    out = {}
    for k, v in arrays.items():
        b = io.BytesIO()
        np.save(b, v)
        out[k + ".npy"] = b.getvalue()
    return out


def test_good_npz_files_read(tmp_path):
    x, c, y = _rows()
    np.savez_compressed(tmp_path / "z.npz", x=x.astype(np.float16), c=c.astype(bool), y=y.astype(np.uint8),
                        concept_names=np.array(["cafe\u0301", "sea"]))
    d = load_concept_arrays(tmp_path / "z.npz")
    assert d.concept_names == ("caf\u00e9", "sea") and d.x_train.dtype == torch.float32  # names NFC


@pytest.mark.parametrize("make, message", [
    # issue 37's list: each escaped as a raw exception
    (lambda p: p.write_bytes(_saved(x=_rows()[0])["x.npy"]),
     r"a \.npy file holds one array; save x, c and y together in a \.npz"),
    (lambda p: p.write_bytes(b""), r"not a \.npz file \(a zip archive of \.npy arrays.*\); the file is empty"),
    (lambda p: p.write_bytes(b"PK\x03\x04" + b"garbage" * 20), r"not a readable \.npz archive \(BadZipFile"),
    (lambda p: _zip(p, {"x.npy": _npy("{'descr': '<f8', 'fortran_order': False, 'shape': (10**12, 3), }".replace(
        "10**12", "1000000000000"), b"\0" * 16), **_saved(c=_rows()[1], y=_rows()[2])}),
     r"array 'x': its header announces \[1000000000000, 3\] float64 \(24,000,000,000,000 bytes\) but the archive holds 16 bytes"),
    (lambda p: _zip(p, {"x.npy": _npy("{'descr': 'bfloat16', 'fortran_order': False, 'shape': (40, 3), }", b"\0" * 240),
                        **_saved(c=_rows()[1], y=_rows()[2])}),
     # numpy knows 'bfloat16' once ml_dtypes is imported (onnx imports it): then the dtype is refused by name
     r"array 'x': (not a readable \.npy header|dtype bfloat16 is not one penrose reads)"),
    (lambda p: np.savez(p, x=_rows()[0] * 1e300, c=_rows()[1], y=_rows()[2]),
     r"x holds -?[0-9.]+e\+300, beyond float32's range"),  # was silently inf
    (lambda p: np.savez(p, x=_rows()[0], c=np.zeros((40, 0)), y=_rows()[2]),
     r"c has no columns \(shape \[40, 0\]\): give at least one concept"),
    # more of the same kind
    (lambda p: np.savez(p, x=_rows()[0], c=_rows()[1], y=np.array([object()] * 40, dtype=object)),
     r"array 'y': dtype object is not one penrose reads"),  # would need unpickling
    (lambda p: np.savez(p, x=_rows()[0].astype(complex), c=_rows()[1], y=_rows()[2]), r"array 'x': dtype complex128"),
    (lambda p: np.savez(p, x=_rows()[0], c=_rows()[1], y=_rows()[2], concept_names=np.array(["\u200b", "b"])),
     r"array 'concept_names': entry 0 \('\\u200b'\) shows nothing"),
    (lambda p: np.savez(p, x=_rows()[0], c=_rows()[1], y=_rows()[2], concept_names=np.array([1, 2])),
     r"array 'concept_names' must be one string per concept, got dtype int64"),
    (lambda p: np.savez(p, x=_rows()[0], c=_rows()[1], y=_rows()[2], concept_names=np.array(["caf\u00e9", "cafe\u0301"])),
     r"concept_names must be 2 distinct names"),  # one name in NFC and NFD
    (lambda p: p.write_bytes(_whole_npz()[:200]), r"not a readable \.npz archive"),  # cut short
    (lambda p: p.write_bytes(_flipped(_whole_npz())), r"(Bad CRC-32|not a readable)"),  # a damaged member
    (lambda p: _zip(p, {"x.npy": _npy("{'descr': '<f8', 'fortran_order': False, 'shape': (-4, 3), }"),
                        **_saved(c=_rows()[1], y=_rows()[2])}), r"array 'x': shape \(-4, 3\) is not a shape"),
])
def test_hostile_npz_files_are_data_errors_naming_the_file(tmp_path, make, message):
    path = tmp_path / "d.npz"
    make(path)
    with pytest.raises(DataError, match=message) as e:
        load_concept_arrays(path)
    assert e.value.path == str(path)


def _whole_npz() -> bytes:
    b = io.BytesIO()
    x, c, y = _rows()
    np.savez(b, x=x, c=c, y=y)
    return b.getvalue()


def _flipped(blob: bytes) -> bytes:
    data = bytearray(blob)
    data[200] ^= 0xFF
    return bytes(data)


def test_npz_paths_that_are_not_files(tmp_path):
    fifo = tmp_path / "f.npz"
    os.mkfifo(fifo)  # issue 37: np.load blocked for ever
    for path, message in ((fifo, "not a regular file"), (tmp_path, "not a regular file"),
                          (tmp_path / "none.npz", "cannot read it: No such file")):
        with pytest.raises(DataError, match=message):
            load_concept_arrays(path)


def test_npz_over_penroses_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("PENROSE_MAX_TENSOR_BYTES", "512")
    x, c, y = _rows()
    np.savez(tmp_path / "d.npz", x=x, c=c, y=y)
    with pytest.raises(DataError, match=r"array 'x': 960 bytes \(\[40, 3\] float64\), beyond penrose's limit of 512"):
        load_concept_arrays(tmp_path / "d.npz")


@pytest.mark.parametrize("call, message", [
    (lambda: toy_concepts("xor", n=5), "n must be a whole number from 10 to"),
    (lambda: toy_concepts("xor", n="100"), "n must be a whole number"),
    (lambda: toy_concepts("xor", seed=2**40), "seed must be a whole number from 0 to"),  # NumPy's own ValueError before
    (lambda: toy_concepts("xor", val_fraction=0.5, test_fraction=0.5), "val_fraction \\+ test_fraction must be below 1"),
    (lambda: penrose_zoo.data.load_tabular("wine", seed=-1), "seed must be a whole number from 0 to"),
])
def test_data_set_arguments(call, message):
    with pytest.raises(PenroseArgumentError, match=message):
        call()


def test_recipe_arguments():
    from penrose_zoo.recipes import run

    with pytest.raises(PenroseArgumentError, match="recipe must be one of 'linear', 'mlp'"):
        run("linaer")
    with pytest.raises(PenroseArgumentError, match="quick must be True or False, got 'yes'"):
        run("linear", quick="yes")


# ---- the validation layer itself --------------------------------------------------------------

def test_numbers_and_whole_numbers():
    assert number(np.float32(0.5), "p", low=0, high=1) == 0.5 and whole(np.int64(3), "n", low=0) == 3
    assert number(torch.tensor(2.0), "x") == 2.0
    for bad in (True, "1", None, float("inf"), [1]):
        with pytest.raises(PenroseArgumentError, match="x must be a finite number"):
            number(bad, "x")
    for bad in (1.0, True, "1", -1):
        with pytest.raises(PenroseArgumentError, match="n must be a whole number of at least 0"):
            whole(bad, "n", low=0)


def test_command_line_types():
    import argparse

    assert cli_whole(low=1)("7") == 7
    for text, message in (("0", "expected a whole number of at least 1, got 0"), ("٣", "in ASCII digits"),
                          ("1.5", "expected a whole number in ASCII digits, got '1.5'")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            cli_whole(low=1)(text)


def test_printing_escapes_what_a_terminal_would_obey():
    hostile = "cats\x1b]0;owned\x07\x1b[2K\r\u202eevil\u200b\x9b\ud800"
    shown = printable(hostile)
    assert shown == "cats\\x1b]0;owned\\x07\\x1b[2K\\x0d\\u202eevil\\u200b\\x9b\\ud800"
    assert printable("line\nnext é", keep="\n") == "line\nnext é"
    import json

    text = json_text({"name": hostile})
    assert json.loads(text) == {"name": hostile} and "\x9b" not in text and "\u202e" not in text
