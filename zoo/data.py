"""Offline data for the zoo: scikit-learn's shipped tables and the Debian `fortunes` corpus.

Nothing here downloads anything; every loader returns torch tensors.

Tabular sets (`load_tabular`)
    'breast_cancer' (569 × 30, binary), 'diabetes' (442 × 10, regression), 'wine' (178 × 13,
    3 classes) and 'digits' (1797 × 64, 10 classes), as shipped inside scikit-learn. The split
    is `sklearn.model_selection.train_test_split` with `random_state=seed` (stratified for the
    classification sets), so it is the same on every machine. Features are standardised with the
    mean and standard deviation of the *training* split only; constant features (digits has
    some always-blank pixels) get a standard deviation of 1 rather than a division by zero.

Fortunes corpus (`read_category_corpus`, `split_by_hash`)
    One file per category; entries are separated by lines holding only `%`. See
    `read_category_corpus` for exactly which files are read and what counts as broken.
    The train/validation split is by a hash of each chunk's text (see `is_validation`): it does
    not depend on file order, platform or Python's hash seed, and identical texts always land
    on the same side.

Concept data (`fortunes_concepts`)
    Concepts are the eight fortune categories below (a chunk's concepts are the categories its
    exact text appears in; almost always exactly one). The task is a coarser, binary grouping
    of those categories (`DEFAULT_GROUPS`):

        y = 1  'science & technology'   computers, science, linux, medicine
        y = 0  'humanities & life'      literature, politics, law, food

    The task is therefore a deterministic function of the concepts, which is exactly the
    setting a concept bottleneck model assumes (concepts complete for the task).

Toy concept data (`toy_concepts`)
    The concept papers' synthetic sets XOR, trigonometry, dot (Espinosa Zarlenga et al. 2022)
    and checkmark (Dominici et al. 2025), generated from a seed and split as PyC splits them.
"""

from __future__ import annotations

import hashlib
import os
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, NamedTuple, Sequence

import numpy as np
import torch

from penrose.errors import PenroseArgumentError
from penrose.tables import FLOAT32_MAX
from penrose_zoo.validate import is_invisible, number, printable, whole

__all__ = [
    "DataError",
    "TabularData",
    "TABULAR_SETS",
    "load_tabular",
    "Chunk",
    "FORTUNES_DIR",
    "read_category_corpus",
    "is_validation",
    "split_by_hash",
    "DEFAULT_CONCEPT_CATEGORIES",
    "DEFAULT_GROUPS",
    "TASK_NAMES",
    "ConceptSplits",
    "ConceptData",
    "fortunes_concepts",
    "TOY_SETS",
    "ToyData",
    "toy_concepts",
    "toy_split",
    "concept_arrays",
    "load_concept_arrays",
    "read_npz",
]


class DataError(ValueError):
    """A data file or directory that cannot be used, with where the problem is.

    `path` is the file or directory; `line` is a 1-based line number, or None when the problem
    is about the whole file (e.g. it holds no entries).
    """

    def __init__(self, message: str, path: str | os.PathLike | None = None, line: int | None = None):
        self.message = message
        self.path = None if path is None else str(path)
        self.line = line
        where = ""
        if self.path is not None:
            where = f"{self.path}:{line}: " if line is not None else f"{self.path}: "
        super().__init__(where + message)


# --------------------------------------------------------------------------------------------
# scikit-learn tables
# --------------------------------------------------------------------------------------------

TABULAR_SETS = {
    # name: (loader name in sklearn.datasets, task)
    "breast_cancer": ("load_breast_cancer", "binary"),
    "diabetes": ("load_diabetes", "regression"),
    "wine": ("load_wine", "multiclass"),
    "digits": ("load_digits", "multiclass"),
}


@dataclass(frozen=True)
class TabularData:
    """A standardised, split tabular data set.

    x_*: float32 (n, d), standardised with the training statistics `feature_mean`,
    `feature_std` (so raw = x * feature_std + feature_mean).
    y_*: 'binary' -> float32 (n,) of 0./1. (ready for BCE-with-logits);
         'multiclass' -> int64 (n,) class indices; 'regression' -> float32 (n,) raw target.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    feature_names: tuple[str, ...]
    task: str
    target_names: tuple[str, ...] = ()
    feature_mean: torch.Tensor | None = field(default=None, repr=False)
    feature_std: torch.Tensor | None = field(default=None, repr=False)

    @property
    def n_features(self) -> int:
        return self.x_train.shape[1]

    @property
    def n_classes(self) -> int:
        """Number of classes (2 for binary, 0 for regression)."""
        return {"binary": 2, "regression": 0}.get(self.task, len(self.target_names))


def load_tabular(name: str, seed: int = 0, val_fraction: float = 0.2) -> TabularData:
    """Load one of scikit-learn's shipped data sets, split and standardised.

    name: 'breast_cancer' | 'diabetes' | 'wine' | 'digits'.
    seed: the split's `random_state`; the same seed gives the same split everywhere.
    val_fraction: share of rows held out for validation (stratified for classification).
    """
    if not isinstance(name, str) or name not in TABULAR_SETS:
        raise ValueError(f"unknown tabular data set {name!r}; choose from {sorted(TABULAR_SETS)}")
    seed = whole(seed, "seed", low=0, high=2**32 - 1)  # (scikit-learn's random_state range)
    val_fraction = number(val_fraction, "val_fraction", low=0.0, high=1.0, low_open=True, high_open=True)
    import sklearn.datasets
    from sklearn.model_selection import train_test_split

    loader_name, task = TABULAR_SETS[name]
    bunch = getattr(sklearn.datasets, loader_name)()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target)
    feature_names = tuple(str(f) for f in getattr(bunch, "feature_names", [f"x{i}" for i in range(x.shape[1])]))
    target_names = () if task == "regression" else tuple(str(t) for t in bunch.target_names)

    idx = np.arange(len(x))
    train_idx, val_idx = train_test_split(
        idx, test_size=val_fraction, random_state=seed, stratify=None if task == "regression" else y
    )
    train_idx, val_idx = np.sort(train_idx), np.sort(val_idx)
    mean = x[train_idx].mean(axis=0)
    std = x[train_idx].std(axis=0)
    std[std == 0] = 1.0
    xs = (x - mean) / std

    def ty(v: np.ndarray) -> torch.Tensor:
        if task == "multiclass":
            return torch.as_tensor(v, dtype=torch.int64)
        return torch.as_tensor(v, dtype=torch.float32)

    return TabularData(
        name=name,
        x_train=torch.as_tensor(xs[train_idx], dtype=torch.float32),
        y_train=ty(y[train_idx]),
        x_val=torch.as_tensor(xs[val_idx], dtype=torch.float32),
        y_val=ty(y[val_idx]),
        feature_names=feature_names,
        task=task,
        target_names=target_names,
        feature_mean=torch.as_tensor(mean, dtype=torch.float32),
        feature_std=torch.as_tensor(std, dtype=torch.float32),
    )


# --------------------------------------------------------------------------------------------
# The fortunes corpus
# --------------------------------------------------------------------------------------------

FORTUNES_DIR = os.environ.get("PENROSE_FORTUNES_DIR", "/usr/share/games/fortunes")

#: Longest plausible single entry, in characters. The longest entry in Debian's corpus is
#: about 2,400 characters; an "entry" longer than this almost surely means missing separators.
MAX_ENTRY_CHARS = 4096


class Chunk(NamedTuple):
    """One fortune: its text and the category (file name) it came from."""

    text: str
    category: str


def _is_binary(data: bytes) -> bool:
    if b"\x00" in data:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _category_files(directory: Path) -> tuple[dict[str, Path], list[str]]:
    """Category name -> file, plus a list of skipped names with reasons."""
    skipped: list[str] = []
    candidates: list[Path] = []
    for p in sorted(directory.iterdir(), key=lambda q: q.name):
        if p.name.startswith("."):
            continue
        if p.is_dir():
            skipped.append(f"{p.name}/ (subdirectory{'; offensive fortunes' if p.name == 'off' else ''})")
            continue
        if not p.is_file():
            skipped.append(f"{p.name} (not a regular file)")
            continue
        if p.name.endswith(".dat"):
            skipped.append(f"{p.name} (strfile index)")
            continue
        candidates.append(p)
    # Symlink aliases (Debian ships `computers.u8 -> computers`) are the same category twice.
    real_of_plain = {p.resolve() for p in candidates if not p.is_symlink()}
    files: dict[str, Path] = {}
    for p in candidates:
        if p.is_symlink() and p.resolve() in real_of_plain:
            skipped.append(f"{p.name} (alias of {p.resolve().name})")
            continue
        if _is_binary(p.read_bytes()):
            skipped.append(f"{p.name} (binary or not UTF-8)")
            continue
        files[p.name] = p
    return files, skipped


def _parse_fortune_file(path: Path, category: str, max_entry_chars: int) -> list[Chunk]:
    """Split one category file into entries; raise DataError for broken files (see below)."""
    text = path.read_bytes().decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    chunks: list[Chunk] = []
    current: list[str] = []
    start = 1
    n_separators = 0

    def flush(end_line: int) -> None:
        entry = "\n".join(current).strip("\n").rstrip()
        if not entry.strip():
            return  # empty entries (e.g. a leading '%' or '%' twice in a row) are allowed
        if len(entry) > max_entry_chars:
            if n_separators == 0:
                msg = (f"no '%' separator lines, and the file's {len(entry)} characters exceed one "
                       f"entry's limit of {max_entry_chars}; entries must be separated by lines "
                       f"holding only '%'")
            else:
                msg = (f"entry starting here runs to line {end_line} and is {len(entry)} characters "
                       f"long (limit {max_entry_chars}); a '%' separator line is probably missing")
            raise DataError(msg, path, start)
        chunks.append(Chunk(entry, category))

    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip()
        if line == "%":
            flush(lineno - 1)
            n_separators += 1
            current = []
            start = lineno + 1
            continue
        stripped = line.strip()
        if stripped and set(stripped) <= {"%", " ", "\t"} and stripped.count("%") >= 1:
            raise DataError(
                f"malformed separator line {raw!r}: a separator is a line holding only '%' "
                f"(no indentation, no repeated '%')",
                path,
                lineno,
            )
        current.append(line)
    flush(len(lines))
    if not chunks:
        raise DataError("no entries: the file holds no non-empty text between '%' separators", path)
    return chunks


def read_category_corpus(
    directory: str | os.PathLike = FORTUNES_DIR,
    categories: Iterable[str] | None = None,
    *,
    max_entry_chars: int = MAX_ENTRY_CHARS,
) -> list[Chunk]:
    """Read a fortune-style corpus: one file per category, entries separated by `%` lines.

    Returns a list of `Chunk(text, category)` (plain 2-tuples), in category order (sorted file
    names, or the order of `categories`) and file order. Entry texts have surrounding blank
    lines and trailing whitespace removed.

    Files read: the regular files directly inside `directory`. Skipped: hidden files, `*.dat`
    (strfile indexes), subdirectories (notably `off/`, the offensive fortunes), symlinks that
    alias another category file (Debian's `*.u8`), and binary files (holding a NUL byte or not
    valid UTF-8).

    Raises DataError (a ValueError) naming the path, and the line where one applies, when
      * `directory` does not exist, is empty, or holds no category files;
      * a category file's name (its concept's name) shows nothing, holds a control character or
        surrounding spaces, or is another's in a different Unicode normal form;
      * a requested category has no file;
      * a category file is broken:
          - zero non-empty entries (empty or whitespace/separators only);
          - no `%` separator line at all while longer than `max_entry_chars` characters;
          - any single entry longer than `max_entry_chars` (a separator is missing);
          - a malformed separator: a line of only `%` and blanks that is not exactly `%`
            (e.g. `%%`, `  %`, `% %`); trailing whitespace after `%` is accepted.
    A file with no separator that is shorter than the limit is one entry, which is fine.
    """
    root = Path(directory)
    if not root.is_dir():
        raise DataError("not a directory (or does not exist)", root)
    if not any(True for _ in root.iterdir()):
        raise DataError("empty directory: no category files", root)
    files, skipped = _category_files(root)
    seen: dict[str, str] = {}
    for name in files:  # a category's name is its file's: a concept name, printed and looked up
        norm = unicodedata.normalize("NFC", name)
        if is_invisible(name) or any(unicodedata.category(ch) == "Cc" for ch in name) or norm != name.strip():
            raise DataError(f"category file {printable(repr(name))}: its name (the concept's name) must be visible text "
                            "without control characters or surrounding spaces", root)
        if norm in seen:
            raise DataError(f"category files {printable(repr(seen[norm]))} and {printable(repr(name))} have the same "
                            "name (Unicode NFC and NFD spellings of it)", root)
        seen[norm] = name
    if not files:
        detail = "; skipped: " + ", ".join(skipped) if skipped else ""
        raise DataError(f"no category files{detail}", root)
    if categories is None:
        names = list(files)
    else:
        names = list(categories)
        missing = [c for c in names if c not in files]
        if missing:
            raise DataError(
                f"no category file for {', '.join(map(repr, missing))}; available: {', '.join(files)}",
                root,
            )
    chunks: list[Chunk] = []
    for name in names:
        chunks.extend(_parse_fortune_file(files[name], name, max_entry_chars))
    return chunks


def is_validation(text: str, val_fraction: float = 0.2, salt: str = "") -> bool:
    """Whether a chunk belongs to the validation split.

    u = first 8 bytes of SHA-256(UTF-8 of salt + text), big-endian, divided by 2**64; the chunk
    is in validation iff u < val_fraction. This depends on the text alone, so it is the same on
    every machine and Python version, and independent of file order.
    """
    digest = hashlib.sha256((salt + text).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < val_fraction


def split_by_hash(chunks: Sequence, val_fraction: float = 0.2, salt: str = "", key=None):
    """Split items into (train, val) lists with `is_validation` on each item's text.

    key: item -> text; by default item[0] (the text of a `Chunk`), or the item if it is a str.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if key is None:
        key = lambda item: item if isinstance(item, str) else item[0]  # noqa: E731
    train: list = []
    val: list = []
    for item in chunks:
        (val if is_validation(key(item), val_fraction, salt) else train).append(item)
    return train, val


# --------------------------------------------------------------------------------------------
# Concept data from the fortunes corpus
# --------------------------------------------------------------------------------------------

TASK_NAMES = ("humanities & life", "science & technology")  # y = 0, y = 1

DEFAULT_GROUPS = {
    # science & technology (y = 1)
    "computers": "science & technology",
    "science": "science & technology",
    "linux": "science & technology",
    "medicine": "science & technology",
    "debian": "science & technology",
    "linuxcookie": "science & technology",
    "perl": "science & technology",
    "startrek": "science & technology",
    # humanities & life (y = 0)
    "literature": "humanities & life",
    "politics": "humanities & life",
    "law": "humanities & life",
    "food": "humanities & life",
    "love": "humanities & life",
    "sports": "humanities & life",
    "education": "humanities & life",
    "songs-poems": "humanities & life",
    "art": "humanities & life",
    "pets": "humanities & life",
    "work": "humanities & life",
    "kids": "humanities & life",
    "men-women": "humanities & life",
    "news": "humanities & life",
}

DEFAULT_CONCEPT_CATEGORIES = (
    "computers", "science", "linux", "medicine",   # science & technology
    "literature", "politics", "law", "food",        # humanities & life
)


@dataclass(frozen=True)
class ConceptSplits:
    """Row-aligned (x, c, y) training and validation tensors of a concept data set."""

    x_train: torch.Tensor
    c_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    c_val: torch.Tensor
    y_val: torch.Tensor

    def train_tuple(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x, c, y) for `penrose_zoo.train.fit`."""
        return (self.x_train, self.c_train, self.y_train)

    def val_tuple(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (self.x_val, self.c_val, self.y_val)


@dataclass(frozen=True)
class ConceptData(ConceptSplits):
    """Chunks of the fortunes corpus with concept and task labels.

    x_*: float32 (n, F) text features; c_*: float32 (n, K) multi-hot concepts (one per
    category, in `concept_names` order); y_*: int64 (n,) task labels indexing `task_names`.
    text_*: the chunk texts, row-aligned. `group_of[category]` is the category's task name.
    `n_dropped` counts texts dropped because they appear in categories of both groups.
    """

    concept_names: tuple[str, ...] = ()
    task_names: tuple[str, ...] = ()
    feature_names: tuple[str, ...] = ()
    group_of: dict = field(repr=False, default_factory=dict)
    text_train: tuple[str, ...] = field(repr=False, default=())
    text_val: tuple[str, ...] = field(repr=False, default=())
    n_dropped: int = 0
    task: str = "binary"


def fortunes_concepts(
    categories: Sequence[str] = DEFAULT_CONCEPT_CATEGORIES,
    max_features: int = 2000,
    seed: int = 0,
    *,
    directory: str | os.PathLike = FORTUNES_DIR,
    groups: dict[str, str] | None = None,
    val_fraction: float = 0.2,
    vectorizer: str = "tfidf",
) -> ConceptData:
    """Concept-supervised text data from the fortunes corpus.

    Each distinct chunk text is one row. Its concepts are the categories (among `categories`)
    whose file holds that exact text — nearly always exactly one; a handful of texts appear in
    two files (e.g. computers and linux) and get two concepts. Its task label is the group of its
    categories under `groups` (default `DEFAULT_GROUPS`; y indexes `TASK_NAMES` when the groups
    are those two names, otherwise the sorted group names); texts whose categories span two
    groups are dropped and counted in `n_dropped`.

    Split: `is_validation(text, val_fraction, salt)` with salt '' for seed 0 (the documented
    fixed split) and f'{seed}:' otherwise.

    Features (fit on the training split only, so validation text never shapes them):
      'tfidf'   — word TF-IDF (words = runs of 2+ letters; English stop words removed;
                  sublinear tf; min_df=2; at most `max_features` words; rows L2-normalised);
                  `feature_names` are the words.
      'hashing' — character 3–5-gram counts hashed into `max_features` buckets (no sign
                  flipping), rows L2-normalised; stateless; `feature_names` are 'hash_<i>'.
    """
    categories = tuple(categories)
    if len(set(categories)) != len(categories):
        raise ValueError(f"duplicate categories in {categories}")
    groups = dict(DEFAULT_GROUPS if groups is None else groups)
    ungrouped = [c for c in categories if c not in groups]
    if ungrouped:
        raise ValueError(f"no task group for categories {ungrouped}; pass groups={{category: group}}")
    group_names = sorted({groups[c] for c in categories})
    task_names = TASK_NAMES if set(group_names) <= set(TASK_NAMES) else tuple(group_names)
    if len(task_names) < 2:
        raise ValueError(f"the categories {categories} all fall in one task group {task_names}")

    chunks = read_category_corpus(directory, categories)
    concept_index = {c: i for i, c in enumerate(categories)}
    by_text: dict[str, set[str]] = {}
    for text, cat in chunks:
        by_text.setdefault(text, set()).add(cat)

    texts, concepts, labels, dropped = [], [], [], 0
    for text, cats in by_text.items():  # dicts keep first-seen order
        task_groups = {groups[c] for c in cats}
        if len(task_groups) > 1:
            dropped += 1
            continue
        row = np.zeros(len(categories), dtype=np.float32)
        for cat in cats:
            row[concept_index[cat]] = 1.0
        texts.append(text)
        concepts.append(row)
        labels.append(task_names.index(task_groups.pop()))

    salt = "" if seed == 0 else f"{seed}:"
    is_val = np.array([is_validation(t, val_fraction, salt) for t in texts], dtype=bool)
    if is_val.all() or not is_val.any():
        raise ValueError(f"hash split left one side empty ({len(texts)} texts, val_fraction={val_fraction})")
    tr, va = np.flatnonzero(~is_val), np.flatnonzero(is_val)
    text_tr = [texts[i] for i in tr]
    text_va = [texts[i] for i in va]

    if vectorizer == "tfidf":
        from sklearn.feature_extraction.text import TfidfVectorizer

        vec = TfidfVectorizer(max_features=max_features, stop_words="english", sublinear_tf=True,
                              token_pattern=r"(?u)\b[^\W\d_]{2,}\b",
                              min_df=2, dtype=np.float32)
        xtr = vec.fit_transform(text_tr)
        xva = vec.transform(text_va)
        feature_names = tuple(vec.get_feature_names_out())
    elif vectorizer == "hashing":
        from sklearn.feature_extraction.text import HashingVectorizer

        vec = HashingVectorizer(n_features=max_features, analyzer="char_wb", ngram_range=(3, 5),
                                alternate_sign=False, norm="l2", dtype=np.float32)
        xtr = vec.transform(text_tr)
        xva = vec.transform(text_va)
        feature_names = tuple(f"hash_{i}" for i in range(max_features))
    else:
        raise ValueError(f"vectorizer must be 'tfidf' or 'hashing', got {vectorizer!r}")

    c = np.stack(concepts)
    y = np.asarray(labels, dtype=np.int64)
    return ConceptData(
        x_train=torch.as_tensor(xtr.toarray(), dtype=torch.float32),
        c_train=torch.as_tensor(c[tr]),
        y_train=torch.as_tensor(y[tr]),
        x_val=torch.as_tensor(xva.toarray(), dtype=torch.float32),
        c_val=torch.as_tensor(c[va]),
        y_val=torch.as_tensor(y[va]),
        concept_names=categories,
        task_names=tuple(task_names),
        feature_names=feature_names,
        group_of={c_: groups[c_] for c_ in categories},
        text_train=tuple(text_tr),
        text_val=tuple(text_va),
        n_dropped=dropped,
    )


# --------------------------------------------------------------------------------------------
# The concept papers' toy data sets: XOR, trigonometry, dot, checkmark
# --------------------------------------------------------------------------------------------
#
# XOR, trigonometry and dot are the synthetic tasks of Espinosa Zarlenga et al., "Concept
# Embedding Models: Beyond the Accuracy-Explainability Trade-Off", NeurIPS 2022 (the generators
# `generate_xor_data`, `generate_trig_data`, `generate_dot_data` of the authors' repository
# mateoespinosa/cem, experiments/synthetic_datasets_experiments.py). Checkmark is from Dominici
# et al., "Causal Concept Graph Models: Beyond Causal Opacity in Deep Learning", ICLR 2025, as
# shipped in PyC (`torch_concepts.data.datasets.toy`). The definitions below are those; the
# seeding and the split are PyC's (`ToyDataset(seed=42, n_gen=10000)` with its random splitter:
# a permutation by `numpy.random.default_rng(split_seed)`, the first 20 % test, the next 10 %
# validation, the rest training), so the same seeds give the same rows as PyC.
# One deliberate difference: PyC's dot re-seeds NumPy before drawing v3, so its v3 equals v1,
# its input's second half is zero and its task is constant (y = ‖v1‖² > 0); here v1 and v3 are
# independent draws, as in the CEM authors' generator.

TOY_SETS = ("xor", "trigonometry", "dot", "checkmark")


@dataclass(frozen=True)
class ToyData(ConceptSplits):
    """A toy concept data set split into train, validation and test.

    x_*: float32 (n, f) inputs; c_*: float32 (n, k) binary concepts; y_*: int64 (n,) binary
    task labels (class indices, for a model with r = 2 outputs). `parents[name]` lists the
    concepts each concept is computed from (checkmark's graph: C = ¬B; the task is A ∧ C);
    `task_parents` the concepts the task is computed from.
    """

    x_test: torch.Tensor
    c_test: torch.Tensor
    y_test: torch.Tensor
    name: str
    concept_names: tuple[str, ...]
    task_names: tuple[str, ...]
    parents: dict = field(default_factory=dict, repr=False)
    task_parents: tuple[str, ...] = ()
    task: str = "multiclass"

    def test_tuple(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (self.x_test, self.c_test, self.y_test)


def _toy_xor(n: int, seed: int):
    rng = np.random.RandomState(seed)  # the generator np.random.seed(seed) resets
    x = rng.uniform(0, 1, (n, 2))
    c = np.stack([x[:, 0] > 0.5, x[:, 1] > 0.5]).T
    y = np.logical_xor(c[:, 0], c[:, 1])
    return x, c, y, ("C1", "C2"), ("xor",), {}, ("C1", "C2")


def _toy_trigonometry(n: int, seed: int):
    rng = np.random.RandomState(seed)
    h = rng.normal(0, 2, (n, 3))
    a, b, z = h[:, 0], h[:, 1], h[:, 2]
    x = np.stack([np.sin(a) + a, np.cos(a) + a, np.sin(b) + b, np.cos(b) + b,
                  np.sin(z) + z, np.cos(z) + z, a ** 2 + b ** 2 + z ** 2]).T
    c = np.stack([a > 0, b > 0, z > 0]).T
    y = (a + b + z) > 1
    return x, c, y, ("C1", "C2", "C3"), ("sumGreaterThan1",), {}, ("C1", "C2", "C3")


def _toy_dot(n: int, seed: int):
    rng = np.random.RandomState(seed)
    v1 = rng.randn(n, 2) * 2
    v3 = rng.randn(n, 2) * 2
    v2, v4 = np.ones(2), -np.ones(2)
    x = np.hstack([v1 + v3, v1 - v3])
    c = np.stack([v1 @ v2 > 0, v3 @ v4 > 0]).T
    y = (v1 * v3).sum(axis=-1) > 0
    return (x, c, y, ("dotV1V2GreaterThan0", "dotV3V4GreaterThan0"), ("dotV1V3GreaterThan0",), {},
            ("dotV1V2GreaterThan0", "dotV3V4GreaterThan0"))


def _toy_checkmark(n: int, seed: int, perturb: float = 0.1):
    g = torch.Generator().manual_seed(seed)  # the stream torch.manual_seed(seed) resets
    a = torch.randint(0, 2, (n,), dtype=torch.bool, generator=g)
    g.manual_seed(seed + 1)
    b = torch.randint(0, 2, (n,), dtype=torch.bool, generator=g)
    c_ = ~b
    d = a & c_
    abcd = torch.stack((a, b, c_, d), dim=1).float()
    g.manual_seed(seed)
    x = abcd * 2 - 1 + torch.randn(abcd.shape, generator=g) * perturb
    # PyC keeps all four as concepts; the last, D, is the task here (the graph's sink)
    return (x.numpy(), abcd[:, :3].numpy() > 0.5, abcd[:, 3].numpy() > 0.5, ("A", "B", "C"), ("D",),
            {"A": (), "B": (), "C": ("B",)}, ("A", "C"))


_TOY_GENERATORS = {"xor": _toy_xor, "trigonometry": _toy_trigonometry, "dot": _toy_dot,
                   "checkmark": _toy_checkmark}


def toy_split(n: int, split_seed: int, val_fraction: float = 0.1, test_fraction: float = 0.2):
    """(train, val, test) index arrays: a permutation by `numpy.random.default_rng(split_seed)`,
    its first ⌊test_fraction·n⌋ entries the test set, the next ⌊val_fraction·n⌋ validation, the
    rest training (PyC's random splitter)."""
    val_fraction = number(val_fraction, "val_fraction", low=0.0, high=1.0, high_open=True)
    test_fraction = number(test_fraction, "test_fraction", low=0.0, high=1.0, high_open=True)
    if val_fraction + test_fraction >= 1:
        raise PenroseArgumentError(f"val_fraction + test_fraction must be below 1 (some rows train); got {val_fraction}, "
                                   f"{test_fraction}")
    split_seed = whole(split_seed, "split_seed", low=0)
    n_test, n_val = int(test_fraction * n), int(val_fraction * n)
    order = np.random.default_rng(split_seed).permutation(n)
    return order[n_test + n_val:], order[n_test:n_test + n_val], order[:n_test]


def toy_concepts(name: str, n: int = 10000, seed: int = 42, split_seed: int | None = None, *,
                 val_fraction: float = 0.1, test_fraction: float = 0.2) -> ToyData:
    """One of the toy concept data sets: 'xor' | 'trigonometry' | 'dot' | 'checkmark'.

    n rows are generated from `seed` (PyC's default: 10 000 rows, seed 42) and split by
    `toy_split(n, split_seed)` (default: `seed`). Inputs, concepts and tasks (the comment
    above `TOY_SETS` cites the papers):

      xor           x ~ U(0, 1)²;  c_i = x_i > 0.5;  y = c_1 xor c_2
      trigonometry  h ~ N(0, 2²)³;  x = (sin h_1 + h_1, cos h_1 + h_1, …, sin h_3 + h_3,
                    cos h_3 + h_3, ‖h‖²);  c_i = h_i > 0;  y = h_1 + h_2 + h_3 > 1
      dot           v1, v3 ~ N(0, 2²)²;  x = (v1 + v3, v1 − v3);  c = (v1·(1, 1) > 0,
                    v3·(−1, −1) > 0);  y = v1·v3 > 0
      checkmark     A, B fair coins;  C = ¬B;  y = D = A ∧ C;  x = 2(A, B, C, D) − 1 + N(0, 0.1²)

    In XOR and checkmark the concepts determine the task; in trigonometry and dot they do not
    (the sign of each h_i does not fix the sign of their sum), so a bottleneck must leak or
    carry extra units to solve them — the CEM paper's point.
    """
    if not isinstance(name, str) or name not in _TOY_GENERATORS:
        raise ValueError(f"unknown toy data set {name!r}; choose from {', '.join(TOY_SETS)}")
    n = whole(n, "n", low=10, high=10**8)  # (rows: 10 at least, and what memory holds)
    seed = whole(seed, "seed", low=0, high=2**32 - 2)  # (NumPy's RandomState range; checkmark seeds seed + 1)
    if split_seed is not None:
        split_seed = whole(split_seed, "split_seed", low=0)
    x, c, y, concept_names, task_names, parents, task_parents = _TOY_GENERATORS[name](n, seed)
    split = toy_split(n, seed if split_seed is None else split_seed, val_fraction, test_fraction)
    return _split_rows(x, c, y, split, name=name, concept_names=concept_names, task_names=task_names,
                       parents=parents, task_parents=task_parents)


def _split_rows(x, c, y, split, **meta) -> ToyData:
    """ToyData of rows x (float32), c (float32), y (int64) taken by `split` = (train, val, test)
    index arrays; `meta` its other fields."""
    x = torch.as_tensor(np.asarray(x), dtype=torch.float32)
    c = torch.as_tensor(np.asarray(c), dtype=torch.float32)
    y = torch.as_tensor(np.asarray(y)).to(torch.int64)
    itr, iva, ite = (torch.as_tensor(i, dtype=torch.int64) for i in split)
    return ToyData(x_train=x[itr], c_train=c[itr], y_train=y[itr], x_val=x[iva], c_val=c[iva], y_val=y[iva],
                   x_test=x[ite], c_test=c[ite], y_test=y[ite], **meta)


def concept_arrays(x, c, y, seed: int = 0, *, name: str = "data", concept_names: Sequence[str] | None = None,
                   task_name: str = "y", val_fraction: float = 0.1, test_fraction: float = 0.2) -> ToyData:
    """One's own rows — x (n, f) inputs, c (n, k) binary concepts, y (n,) binary task labels —
    split as the toy sets are (`toy_split(n, seed)`: 20 % test, 10 % validation), for the zoo's
    concept models and `bench/pyc.py --data`. Arrays or tensors; a clear ValueError names the
    array that does not fit."""
    seed = whole(seed, "seed", low=0)
    arrays = {}
    for label, value, dims in (("x", x, 2), ("c", c, 2), ("y", y, 1)):
        a = np.asarray(value.detach().cpu() if isinstance(value, torch.Tensor) else value)
        if a.ndim != dims:
            raise ValueError(f"{label} must have {dims} dimension{'s' if dims > 1 else ''}, got shape {list(a.shape)}")
        if a.dtype.kind not in "biuf":
            raise ValueError(f"{label} must hold numbers, got dtype {a.dtype}")
        wide = a.astype(np.float64)
        if not np.isfinite(wide).all():
            raise ValueError(f"{label} holds a value that is not finite")
        if a.size and np.abs(wide).max() > FLOAT32_MAX:  # it would be ±inf as the float32 the models read
            raise ValueError(f"{label} holds {wide.flat[int(np.abs(wide).argmax())]:g}, beyond float32's range (±3.4e38)")
        if dims == 2 and a.shape[1] == 0:
            raise ValueError(f"{label} has no columns (shape {list(a.shape)}): give at least one "
                             f"{'feature' if label == 'x' else 'concept'}")
        arrays[label] = a
    n = len(arrays["x"])
    for label in ("c", "y"):
        if len(arrays[label]) != n:
            raise ValueError(f"{label} has {len(arrays[label])} rows, x has {n}")
        if not np.isin(arrays[label], (0, 1)).all():
            raise ValueError(f"{label} must be binary (0 or 1)")
    if n < 10:
        raise ValueError(f"need at least 10 rows, got {n}")
    k = arrays["c"].shape[1]
    names = tuple(str(v) for v in concept_names) if concept_names is not None else tuple(f"c{i}" for i in range(k))
    if len(names) != k or len(set(names)) != k:
        raise ValueError(f"concept_names must be {k} distinct names, got {list(names)}")
    if task_name in names:
        raise ValueError(f"the task's name {task_name!r} is also a concept's")
    return _split_rows(arrays["x"], arrays["c"], arrays["y"], toy_split(n, seed, val_fraction, test_fraction),
                       name=name, concept_names=names, task_names=(task_name,))


def load_concept_arrays(path: str | os.PathLike, seed: int = 0, **kw) -> ToyData:
    """`concept_arrays` of a NumPy `.npz` file holding arrays `x`, `c` and `y` (and optionally
    `concept_names`, strings), named by the file's stem. The file is read as untrusted input
    (`read_npz`): a regular file and a zip archive of `.npy` arrays only, each array's size taken
    from its header and checked against the bytes the archive holds and penrose's limits before
    anything is allocated, nothing unpickled; every failure a `DataError` naming the file and the
    array."""
    path = Path(path)
    arrays = read_npz(path, ("x", "c", "y"), optional=("concept_names",))
    given = arrays.get("concept_names")
    names = None
    if given is not None:
        if given.ndim != 1 or given.dtype.kind != "U":
            raise DataError(f"array 'concept_names' must be one string per concept, got dtype {given.dtype} and "
                            f"shape {list(given.shape)}", path)
        names = [unicodedata.normalize("NFC", str(v)).strip() for v in given]
        blank = [i for i, v in enumerate(names) if is_invisible(v)]
        if blank:
            raise DataError(f"array 'concept_names': entry {blank[0]} ({printable(repr(names[blank[0]]))}) shows "
                            "nothing; a concept needs a visible name", path)
    try:
        return concept_arrays(arrays["x"], arrays["c"], arrays["y"], seed, name=path.stem, concept_names=names, **kw)
    except ValueError as e:
        raise DataError(str(e), path) from None


#: the kinds of array `read_npz` reads: booleans, integers, floats, and Unicode strings
_NPZ_KINDS = {"b": "booleans", "i": "integers", "u": "integers", "f": "floats", "U": "strings"}


def read_npz(path: str | os.PathLike, names: Sequence[str], optional: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """The arrays `names` (and those of `optional` it holds) of the `.npz` archive at `path`,
    read as untrusted input. Refused, each a DataError naming the file (and the array): a path
    that is not a regular file (a FIFO would block, a device never end) — checked before it is
    opened; a `.npy` file (one array) or anything else that is not a zip archive; a damaged
    archive; a missing array; an array whose header cannot be read, whose dtype is not booleans,
    integers, floats or strings (object arrays would need unpickling; bfloat16 and other
    extension types), whose header announces more bytes than the archive holds for it (a tiny
    file claiming terabytes), or that is larger than penrose's limits (`penrose.checker.LIMITS`:
    PENROSE_MAX_TENSOR_BYTES per array, PENROSE_MAX_TOTAL_BYTES together) — all before anything
    is allocated."""
    import stat
    import zipfile

    from penrose.checker import LIMITS

    path = Path(path)
    try:
        st = os.stat(path)
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read it: {getattr(e, 'strerror', None) or e}", path) from None
    if not stat.S_ISREG(st.st_mode):
        raise DataError("not a regular file (a directory, a FIFO or a device); give a .npz file", path)
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError as e:
        raise DataError(f"cannot read it: {e.strerror or e}", path) from None
    if head.startswith(b"\x93NUMPY"):
        raise DataError("a .npy file holds one array; save x, c and y together in a .npz "
                        "(numpy.savez(path, x=x, c=c, y=y))", path)
    if not head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        raise DataError("not a .npz file (a zip archive of .npy arrays, as numpy.savez writes)"
                        + ("; the file is empty" if not head else ""), path)
    limit, total_limit = LIMITS.value("tensor_bytes"), LIMITS.value("total_bytes")
    out: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as z:
            members = {n.removesuffix(".npy"): n for n in z.namelist() if n.endswith(".npy")}
            missing = [n for n in names if n not in members]
            if missing:
                held = ", ".join(members) or "none"
                raise DataError(f"no array {', '.join(repr(n) for n in missing)} (it holds {held})", path)
            total = 0
            for name in [*names, *(n for n in optional if n in members)]:
                info = z.getinfo(members[name])
                with z.open(info) as f:
                    shape, fortran, dtype, offset = _npy_header(f, name, path)
                    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
                    if nbytes + offset != info.file_size:
                        raise DataError(f"array {name!r}: its header announces {list(shape)} {dtype} ({nbytes:,} bytes) "
                                        f"but the archive holds {max(info.file_size - offset, 0):,} bytes of data", path)
                    total += nbytes
                    if nbytes > limit or total > total_limit:
                        raise DataError(f"array {name!r}: {nbytes:,} bytes ({list(shape)} {dtype}), beyond penrose's "
                                        f"limit of {limit if nbytes > limit else total_limit:,} bytes"
                                        f"{' in all' if nbytes <= limit else ''} (PENROSE_MAX_TENSOR_BYTES, "
                                        "PENROSE_MAX_TOTAL_BYTES raise it)", path)
                    data = f.read(nbytes + 1)  # (one byte more: the end of the member, its CRC checked)
                if len(data) != nbytes:
                    raise DataError(f"array {name!r}: {len(data):,} bytes of data, its header announces {nbytes:,}", path)
                array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
                out[name] = array.copy()  # (a writable array of its own)
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, NotImplementedError, RuntimeError) as e:
        # a damaged archive: a bad CRC, a truncated member, an unsupported compression or encryption
        raise DataError(f"not a readable .npz archive ({type(e).__name__}: {e})", path) from None
    return out


def _npy_header(f, name: str, path: Path) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran order, dtype, data offset) of the .npy member `f`, its header read by
    numpy's own parser (a literal; nothing is evaluated or unpickled)."""
    from numpy.lib import format as npy

    try:
        version = npy.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npy.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = npy.read_array_header_2_0(f)
        else:
            raise ValueError(f".npy format version {version[0]}.{version[1]} (penrose reads 1.0 and 2.0)")
    except Exception as e:  # noqa: BLE001 - numpy's parser raises ValueError, TypeError (an unknown dtype), SyntaxError
        raise DataError(f"array {name!r}: not a readable .npy header ({type(e).__name__}: {e})", path) from None
    if dtype.hasobject or dtype.kind not in _NPZ_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise DataError(f"array {name!r}: dtype {dtype} is not one penrose reads ({', '.join(sorted(set(_NPZ_KINDS.values())))}"
                        "; object arrays would need unpickling)", path)
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise DataError(f"array {name!r}: shape {shape} is not a shape", path)
    return tuple(shape), bool(fortran), dtype, f.tell()
