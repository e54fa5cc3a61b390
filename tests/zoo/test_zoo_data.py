"""Tests for penrose_zoo.data: scikit-learn tables, the fortunes reader, the hash split, concept data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from penrose_zoo.data import (
    DEFAULT_CONCEPT_CATEGORIES,
    DEFAULT_GROUPS,
    FORTUNES_DIR,
    TASK_NAMES,
    Chunk,
    DataError,
    fortunes_concepts,
    is_validation,
    load_tabular,
    read_category_corpus,
    split_by_hash,
)

HAVE_FORTUNES = Path(FORTUNES_DIR, "science").is_file()
needs_fortunes = pytest.mark.skipif(not HAVE_FORTUNES, reason=f"fortunes corpus not at {FORTUNES_DIR}")

EXPECTED = {
    # name: (n rows, n features, task, y dtype)
    "breast_cancer": (569, 30, "binary", torch.float32),
    "diabetes": (442, 10, "regression", torch.float32),
    "wine": (178, 13, "multiclass", torch.int64),
    "digits": (1797, 64, "multiclass", torch.int64),
}


# ------------------------------------------------------------------------------------------
# tabular
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tabular_shapes_and_standardisation(name):
    n, d, task, ydtype = EXPECTED[name]
    data = load_tabular(name)
    assert data.task == task
    assert data.x_train.dtype == data.x_val.dtype == torch.float32
    assert data.y_train.dtype == data.y_val.dtype == ydtype
    assert data.x_train.shape[1] == data.x_val.shape[1] == d == len(data.feature_names)
    assert data.x_train.shape[0] + data.x_val.shape[0] == n
    assert data.y_train.shape == (data.x_train.shape[0],)
    assert abs(data.x_val.shape[0] - round(0.2 * n)) <= 1
    assert torch.isfinite(data.x_train).all() and torch.isfinite(data.x_val).all()
    # standardised with training statistics: train mean 0, train std 1 (or constant columns 0)
    assert torch.allclose(data.x_train.mean(0), torch.zeros(d), atol=1e-5)
    std = data.x_train.std(0, unbiased=False)
    assert torch.all(((std - 1).abs() < 1e-4) | (std < 1e-6))
    if task != "regression":
        assert set(data.y_train.long().tolist()) == set(range(data.n_classes))


def test_tabular_split_deterministic_and_seeded():
    a, b = load_tabular("wine", seed=0), load_tabular("wine", seed=0)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_val, b.y_val)
    c = load_tabular("wine", seed=1)
    assert not torch.equal(a.x_train, c.x_train)
    d = load_tabular("wine", val_fraction=0.5)
    assert d.x_val.shape[0] == 89


def test_tabular_standardisation_uses_train_only():
    from sklearn.datasets import load_breast_cancer

    data = load_tabular("breast_cancer")
    raw = torch.as_tensor(load_breast_cancer().data, dtype=torch.float64)
    # raw = x * std + mean reproduces the original rows exactly
    back = data.x_train.double() * data.feature_std.double() + data.feature_mean.double()
    rel = ((back[:, None, :] - raw[None, :, :]).abs() / (raw.abs() + 1)).amax(-1)  # (train, all)
    assert (rel.min(1).values < 1e-5).all()
    # and the statistics are those of the training rows
    assert torch.allclose(back.mean(0), data.feature_mean.double(), rtol=1e-5)
    # validation statistics are not forced to 0 / 1
    assert data.x_val.mean(0).abs().max() > 1e-3


def test_tabular_unknown_name():
    with pytest.raises(ValueError, match="unknown tabular"):
        load_tabular("iris")


# ------------------------------------------------------------------------------------------
# corpus reader on small files made here
# ------------------------------------------------------------------------------------------

def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_reader_parses_entries_and_skips_extras(tmp_path):
    _write(tmp_path / "science", "E = mc^2\n%\nTwo\nlines\n%\n\n%\nlast one\n")
    _write(tmp_path / "food", "%\nPie.\n%   \n")  # leading separator, trailing spaces ok
    (tmp_path / "science.dat").write_bytes(b"\x00\x00\x00\x02binary index")
    (tmp_path / "blob").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (tmp_path / "latin").write_bytes(b"caf\xe9\n%\n")
    (tmp_path / "off").mkdir()
    _write(tmp_path / "off" / "rude", "rot13 text\n%\n")
    os.symlink("science", tmp_path / "science.u8")
    chunks = read_category_corpus(tmp_path)
    assert chunks == [
        Chunk("Pie.", "food"),
        Chunk("E = mc^2", "science"),
        Chunk("Two\nlines", "science"),
        Chunk("last one", "science"),
    ]
    assert all(isinstance(c, tuple) and len(c) == 2 for c in chunks)
    assert read_category_corpus(tmp_path, categories=["science"])[0] == ("E = mc^2", "science")


def test_reader_single_entry_without_separator_is_fine(tmp_path):
    _write(tmp_path / "tao", "A short saying without any separator.\n")
    assert read_category_corpus(tmp_path) == [("A short saying without any separator.", "tao")]


def test_reader_empty_directory(tmp_path):
    with pytest.raises(DataError, match="empty directory") as err:
        read_category_corpus(tmp_path)
    assert err.value.path == str(tmp_path)


def test_reader_missing_directory(tmp_path):
    with pytest.raises(DataError, match="not a directory"):
        read_category_corpus(tmp_path / "nope")


def test_reader_directory_without_category_files(tmp_path):
    (tmp_path / "a.dat").write_bytes(b"\x00\x01")
    (tmp_path / "off").mkdir()
    with pytest.raises(DataError, match="no category files") as err:
        read_category_corpus(tmp_path)
    assert "a.dat" in str(err.value)


def test_reader_unknown_category(tmp_path):
    _write(tmp_path / "science", "x\n%\n")
    with pytest.raises(DataError, match="'sports'"):
        read_category_corpus(tmp_path, categories=["science", "sports"])


@pytest.mark.parametrize(
    "content, message, line",
    [
        ("", "no entries", None),
        ("\n%\n   \n%\n\n", "no entries", None),
        ("word " * 1000, "no '%' separator lines", 1),
        ("ok\n%\n" + "long line\n" * 500 + "%\nend\n", "separator line is probably missing", 3),
        ("one\n%%\ntwo\n", "malformed separator", 2),
        ("one\n%\ntwo\n  %\nthree\n", "malformed separator", 4),
    ],
    ids=["empty", "only-separators", "no-separators-too-long", "entry-too-long", "double-percent", "indented"],
)
def test_reader_broken_files_name_file_and_line(tmp_path, content, message, line):
    _write(tmp_path / "good", "fine\n%\n")
    bad = _write(tmp_path / "broken", content)
    with pytest.raises(DataError, match=message) as err:
        read_category_corpus(tmp_path)
    assert isinstance(err.value, ValueError)
    assert err.value.path == str(bad)
    assert err.value.line == line
    assert str(bad) in str(err.value)


# ------------------------------------------------------------------------------------------
# hash split
# ------------------------------------------------------------------------------------------

def test_hash_split_is_stable_and_fractional():
    # golden values: SHA-256 based, so they hold on every machine
    assert is_validation("hello world", 0.2) is False
    assert [is_validation(f"chunk {i}", 0.2) for i in range(10)] == [
        is_validation(f"chunk {i}", 0.2) for i in range(10)
    ]
    texts = [f"fortune number {i}" for i in range(5000)]
    train, val = split_by_hash(texts, 0.2)
    assert len(train) + len(val) == 5000
    assert 0.17 < len(val) / 5000 < 0.23
    # order does not matter
    train2, val2 = split_by_hash(list(reversed(texts)), 0.2)
    assert set(val2) == set(val)
    # a salt gives another split
    _, val3 = split_by_hash(texts, 0.2, salt="1:")
    assert set(val3) != set(val)


def test_hash_split_golden():
    import hashlib

    text = "1 + 1 = 3, for large values of 1."
    u = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64
    assert is_validation(text, 0.2) == (u < 0.2)
    assert is_validation(text, u + 1e-9) and not is_validation(text, u - 1e-9)


# ------------------------------------------------------------------------------------------
# the real corpus
# ------------------------------------------------------------------------------------------

@needs_fortunes
def test_real_corpus_reads_cleanly():
    chunks = read_category_corpus(FORTUNES_DIR, categories=DEFAULT_CONCEPT_CATEGORIES)
    cats = {c for _, c in chunks}
    assert cats == set(DEFAULT_CONCEPT_CATEGORIES)
    assert len(chunks) > 3000
    assert all(t.strip() and "\n%\n" not in t for t, _ in chunks)


@needs_fortunes
def test_fortunes_concepts():
    data = fortunes_concepts()
    k = len(DEFAULT_CONCEPT_CATEGORIES)
    assert data.concept_names == DEFAULT_CONCEPT_CATEGORIES
    assert data.task_names == TASK_NAMES
    assert data.x_train.shape == (len(data.text_train), 2000)
    assert data.x_val.shape == (len(data.text_val), 2000)
    assert data.c_train.shape == (data.x_train.shape[0], k)
    assert data.x_train.dtype == data.c_train.dtype == torch.float32
    assert data.y_train.dtype == torch.int64
    assert 0.15 < data.x_val.shape[0] / (data.x_train.shape[0] + data.x_val.shape[0]) < 0.25
    # every row has at least one concept; every concept occurs in both splits
    assert (data.c_train.sum(1) >= 1).all() and (data.c_val.sum(1) >= 1).all()
    assert (data.c_train.sum(0) > 0).all() and (data.c_val.sum(0) > 0).all()
    # the task is the group of the concepts
    sci = torch.tensor([DEFAULT_GROUPS[c] == "science & technology" for c in data.concept_names])
    expect = (data.c_train[:, sci].sum(1) > 0).long()
    assert torch.equal(expect, data.y_train)
    assert 0 < data.y_train.float().mean() < 1
    # no text in both splits; deterministic
    assert not set(data.text_train) & set(data.text_val)
    again = fortunes_concepts()
    assert torch.equal(again.x_val, data.x_val) and again.text_train == data.text_train
    # features are real words fit on train
    assert "computer" in data.feature_names or "computers" in data.feature_names


@needs_fortunes
def test_fortunes_concepts_hashing_and_seed():
    a = fortunes_concepts(categories=("computers", "food"), max_features=256, vectorizer="hashing")
    assert a.x_train.shape[1] == 256 and a.c_train.shape[1] == 2
    assert torch.equal(a.c_train[:, 0].long(), a.y_train)  # computers -> science & technology
    b = fortunes_concepts(categories=("computers", "food"), max_features=256, vectorizer="hashing", seed=1)
    assert set(a.text_val) != set(b.text_val)
    with pytest.raises(ValueError, match="no task group"):
        fortunes_concepts(categories=("computers", "zippy"))


# ---- one's own rows (`concept_arrays`, `load_concept_arrays`, bench/pyc.py --data) ----


def _rows(n=50, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    c = (x[:, :2] > 0).astype(np.float32)
    return x, c, (c[:, 0] * c[:, 1]).astype(np.int64)


def test_concept_arrays_split_as_the_toy_sets():
    from penrose_zoo.data import concept_arrays, toy_split

    x, c, y = _rows()
    d = concept_arrays(x, c, y, seed=3, concept_names=["left", "right"])
    tr, va, te = toy_split(50, 3)
    assert (len(d.x_train), len(d.x_val), len(d.x_test)) == (35, 5, 10) == (len(tr), len(va), len(te))
    torch.testing.assert_close(d.x_test, torch.as_tensor(x[te]))
    assert d.c_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    assert d.concept_names == ("left", "right") and d.task_names == ("y",) and d.name == "data"
    assert concept_arrays(torch.as_tensor(x), torch.as_tensor(c), torch.as_tensor(y)).concept_names == ("c0", "c1")


@pytest.mark.parametrize("change, message", [
    (lambda x, c, y: (x[:, 0], c, y), r"x must have 2 dimensions, got shape \[50\]"),
    (lambda x, c, y: (x, c[:40], y), "c has 40 rows, x has 50"),
    (lambda x, c, y: (x, c * 2, y), r"c must be binary \(0 or 1\)"),
    (lambda x, c, y: (x, c, y + 0.5), r"y must be binary \(0 or 1\)"),
    (lambda x, c, y: (x.astype(str), c, y), "x must hold numbers"),
    (lambda x, c, y: (x * float("nan"), c, y), "x holds a value that is not finite"),
    (lambda x, c, y: (x[:5], c[:5], y[:5]), "need at least 10 rows, got 5"),
])
def test_concept_arrays_name_what_does_not_fit(change, message):
    from penrose_zoo.data import concept_arrays

    with pytest.raises(ValueError, match=message):
        concept_arrays(*change(*_rows()))


def test_concept_arrays_names_are_checked():
    from penrose_zoo.data import concept_arrays

    with pytest.raises(ValueError, match="concept_names must be 2 distinct names"):
        concept_arrays(*_rows(), concept_names=["a", "a"])
    with pytest.raises(ValueError, match="the task's name 'y' is also a concept's"):
        concept_arrays(*_rows(), concept_names=["a", "y"])


def test_load_concept_arrays_reads_npz_and_names_the_file(tmp_path):
    import numpy as np

    from penrose_zoo.data import DataError, load_concept_arrays

    x, c, y = _rows()
    good = tmp_path / "mine.npz"
    np.savez(good, x=x, c=c, y=y, concept_names=np.array(["left", "right"]))
    d = load_concept_arrays(good, seed=1)
    assert d.name == "mine" and d.concept_names == ("left", "right") and len(d.x_train) == 35
    missing = tmp_path / "missing.npz"
    np.savez(missing, x=x, c=c)
    with pytest.raises(DataError, match=r"missing\.npz: no array 'y' \(it holds x, c\)"):
        load_concept_arrays(missing)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, x=x, c=c, y=np.array([object()] * 50, dtype=object))
    with pytest.raises(DataError, match=r"pickled\.npz: array 'y': dtype object is not one penrose reads"):
        load_concept_arrays(pickled)  # object arrays would need unpickling: refused
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"not a zip file")
    with pytest.raises(DataError, match=r"broken\.npz: not a \.npz file"):
        load_concept_arrays(broken)
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=x, c=c * 3, y=y)
    with pytest.raises(DataError, match=r"bad\.npz: c must be binary"):
        load_concept_arrays(bad)
