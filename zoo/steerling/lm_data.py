"""Language-model data with chunk-level concept labels, for training Steerling on real text.

Pipeline (each step a function, so any step can be swapped):

    directory of category files ──load_concept_corpus──▶ ConceptCorpus (labelled chunk texts,
        (fortunes format: entries                          fixed train / validation split)
         separated by '%' lines)
    ConceptCorpus.train / .val ──pack_chunks(tokenizer, seq_len)──▶ PackedData (N, T) tensors
    PackedData ──iterate_lm_batches(batch_size)──▶ LMBatch (ids, per-token chunk index,
                                                              chunk labels)

Chunks and labels
    A chunk is one entry of a category file. Its concepts are the categories (mapped through
    `concept_of`, by default each category is its own concept) of every file that holds that
    exact text — nearly always one. Labels are chunk-level and positive-only, as in the post:
    a 1 means "present somewhere in the chunk", a 0 means "not annotated", not "absent".
    Concept ids index `ConceptCorpus.concept_names`, which is sorted.

Split
    Fixed and documented: `penrose_zoo.data.is_validation(text, val_fraction, salt)` on the chunk text
    (SHA-256, so identical on every machine; duplicates land on the same side). Default
    val_fraction 0.2, salt ''.

Sequences (`pack_chunks`)
    Every chunk is tokenised and followed by the end-of-chunk token. Chunks are shuffled (fixed
    seed) and packed whole, greedily, into rows of `seq_len` tokens: a row starts with <|bos|>
    (optional), takes chunks while they fit, and is padded with <|pad|> at the end. A chunk
    longer than a row is cut into row-sized pieces; only the last piece ends in <|eoc|>, and
    every piece carries the chunk's index (so a batch holding several pieces pools them).
    Per token, `chunk_index` gives the chunk the token belongs to (an index into
    `PackedData.chunk_labels`), or −1 for <|bos|> and <|pad|>; the <|eoc|> token belongs to the
    chunk it closes. Attention may cross chunk boundaries (ordinary packed pre-training).

Errors (penrose_zoo.data.DataError, naming the file or directory): everything read_category_corpus
rejects (missing/empty directory, empty files, broken '%' separators, over-long entries), a
corpus in which no chunk has a concept label, and a split that leaves one side empty.

    >>> from penrose_zoo.steerling.tokenizer import ByteTokenizer
    >>> corpus = load_concept_corpus()                                    # doctest: +SKIP
    >>> train = pack_chunks(corpus.train, ByteTokenizer(), seq_len=256, n_concepts=corpus.n_concepts)  # doctest: +SKIP
    >>> batch = next(iterate_lm_batches(train, batch_size=8))            # doctest: +SKIP
    >>> batch.input_ids.shape, batch.chunk_labels.shape                   # doctest: +SKIP
    (torch.Size([8, 256]), torch.Size([c, n]))
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

import torch

from penrose_zoo.data import FORTUNES_DIR, DataError, is_validation, read_category_corpus

__all__ = [
    "LabelledChunk",
    "ConceptCorpus",
    "load_concept_corpus",
    "PackedData",
    "LMBatch",
    "pack_chunks",
    "iterate_lm_batches",
    "token_concept_labels",
]


@dataclass(frozen=True)
class LabelledChunk:
    """One chunk's text and its positive concept ids (sorted, non-empty for labelled chunks)."""

    text: str
    concepts: tuple[int, ...]


@dataclass(frozen=True)
class ConceptCorpus:
    """Labelled chunks split into train and validation; concept id i names concept_names[i]."""

    train: tuple[LabelledChunk, ...]
    val: tuple[LabelledChunk, ...]
    concept_names: tuple[str, ...]
    directory: str = ""
    n_unlabelled: int = 0  # chunks dropped because their category maps to no concept

    @property
    def n_concepts(self) -> int:
        return len(self.concept_names)


def load_concept_corpus(
    directory: str | os.PathLike = FORTUNES_DIR,
    categories: Iterable[str] | None = None,
    *,
    concept_of: Mapping[str, str | Sequence[str] | None] | None = None,
    val_fraction: float = 0.2,
    salt: str = "",
) -> ConceptCorpus:
    """Read a fortune-style directory into labelled chunks with the fixed hash split.

    categories: file names to read (default: every category file, see read_category_corpus).
    concept_of: category -> concept name, list of names, or None (the chunks of that category
      then carry no label and are dropped, counted in n_unlabelled). Default: the category name.
    """
    chunks = read_category_corpus(directory, categories)
    where = Path(directory)

    def concepts_for(cat: str) -> tuple[str, ...]:
        if concept_of is None:
            return (cat,)
        if cat not in concept_of:
            return ()
        c = concept_of[cat]
        if c is None:
            return ()
        return (c,) if isinstance(c, str) else tuple(c)

    by_text: dict[str, set[str]] = {}
    for text, cat in chunks:
        by_text.setdefault(text, set()).update(concepts_for(cat))
    names = sorted({c for cs in by_text.values() for c in cs})
    if not names:
        raise DataError(
            f"unlabelled corpus: none of the {len(by_text)} chunks has a concept label "
            f"(check concept_of / categories)", where)
    index = {n: i for i, n in enumerate(names)}
    labelled = [LabelledChunk(t, tuple(sorted(index[c] for c in cs))) for t, cs in by_text.items() if cs]
    n_unlabelled = len(by_text) - len(labelled)
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    train: list[LabelledChunk] = []
    val: list[LabelledChunk] = []
    for ch in labelled:
        (val if is_validation(ch.text, val_fraction, salt) else train).append(ch)
    if not train or not val:
        side = "training" if not train else "validation"
        raise DataError(
            f"the hash split (val_fraction={val_fraction}) left the {side} side empty "
            f"({len(labelled)} labelled chunks); add chunks or change val_fraction", where)
    return ConceptCorpus(tuple(train), tuple(val), tuple(names), str(where), n_unlabelled)


@dataclass(frozen=True)
class PackedData:
    """Packed token rows. input_ids, chunk_index: int64 (N, T); chunk_labels: float32 (C, n),
    row c the 0/1 labels of chunk c; chunk_index −1 marks <|bos|> and <|pad|>."""

    input_ids: torch.Tensor
    chunk_index: torch.Tensor
    chunk_labels: torch.Tensor
    texts: tuple[str, ...] = field(repr=False, default=())
    pad_id: int = 0

    @property
    def n_rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def n_chunks(self) -> int:
        return self.chunk_labels.shape[0]


@dataclass(frozen=True)
class LMBatch:
    """A batch of rows with chunk indices made local: chunk_index (b, t) indexes chunk_labels
    (c, n) of this batch (−1 = no chunk); chunk_ids (c,) are the chunks' indices in PackedData."""

    input_ids: torch.Tensor
    chunk_index: torch.Tensor
    chunk_labels: torch.Tensor
    chunk_ids: torch.Tensor
    pad_id: int = 0

    @property
    def valid(self) -> torch.Tensor:
        """(b, t) bool: tokens that belong to a chunk (not <|bos|>, not <|pad|>)."""
        return self.chunk_index >= 0

    def to(self, device) -> "LMBatch":
        return LMBatch(self.input_ids.to(device), self.chunk_index.to(device),
                       self.chunk_labels.to(device), self.chunk_ids.to(device), self.pad_id)

    def token_labels(self) -> torch.Tensor:
        """(b, t, n) per-token labels: each token gets its chunk's labels; zeros off chunks."""
        return token_concept_labels(self.chunk_index, self.chunk_labels)


def token_concept_labels(chunk_index: torch.Tensor, chunk_labels: torch.Tensor) -> torch.Tensor:
    """Broadcast chunk labels (c, n) to tokens via chunk_index (b, t); −1 gives a zero row."""
    safe = chunk_index.clamp_min(0)
    out = chunk_labels[safe]
    return out * (chunk_index >= 0).unsqueeze(-1).to(out.dtype)


def pack_chunks(
    chunks: Sequence[LabelledChunk],
    tokenizer,
    seq_len: int,
    *,
    n_concepts: int,
    add_bos: bool = True,
    shuffle_seed: int | None = 0,
) -> PackedData:
    """Tokenise chunks (each + <|eoc|>) and pack them whole into rows of `seq_len` (see module doc).

    tokenizer: anything with encode_batch(texts) -> list of id lists, and pad_id, bos_id,
    eoc_id (penrose_zoo.steerling.tokenizer). shuffle_seed: order of chunks before packing (None keeps
    the given order).
    """
    room = seq_len - (1 if add_bos else 0)
    if room < 1:
        raise ValueError(f"seq_len {seq_len} leaves no room for tokens")
    if not chunks:
        raise ValueError("no chunks to pack")
    order = list(range(len(chunks)))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    encoded = tokenizer.encode_batch([chunks[i].text for i in order])
    labels = torch.zeros(len(chunks), n_concepts, dtype=torch.float32)
    for i, ch in enumerate(chunks):
        if ch.concepts and max(ch.concepts) >= n_concepts:
            raise ValueError(f"chunk {i} has concept id {max(ch.concepts)} ≥ n_concepts={n_concepts}")
        labels[i, list(ch.concepts)] = 1.0

    rows_ids: list[list[int]] = []
    rows_idx: list[list[int]] = []
    cur_ids: list[int] = []
    cur_idx: list[int] = []

    def new_row() -> None:
        nonlocal cur_ids, cur_idx
        if cur_ids:
            rows_ids.append(cur_ids)
            rows_idx.append(cur_idx)
        cur_ids = [tokenizer.bos_id] if add_bos else []
        cur_idx = [-1] if add_bos else []

    new_row()
    base = 1 if add_bos else 0
    for ci, toks in zip(order, encoded):
        toks = list(toks) + [tokenizer.eoc_id]
        if len(cur_ids) - base + len(toks) > room and len(cur_ids) > base:
            new_row()
        while len(toks) > room:  # a chunk longer than a row: row-sized pieces
            cur_ids += toks[:room]
            cur_idx += [ci] * room
            toks = toks[room:]
            new_row()
        cur_ids += toks
        cur_idx += [ci] * len(toks)
    if len(cur_ids) > base:
        rows_ids.append(cur_ids)
        rows_idx.append(cur_idx)

    n = len(rows_ids)
    ids = torch.full((n, seq_len), tokenizer.pad_id, dtype=torch.long)
    idx = torch.full((n, seq_len), -1, dtype=torch.long)
    for r, (a, b) in enumerate(zip(rows_ids, rows_idx)):
        ids[r, : len(a)] = torch.tensor(a, dtype=torch.long)
        idx[r, : len(b)] = torch.tensor(b, dtype=torch.long)
    return PackedData(ids, idx, labels, tuple(c.text for c in chunks), tokenizer.pad_id)


def iterate_lm_batches(
    data: PackedData,
    batch_size: int,
    generator: torch.Generator | None = None,
    *,
    drop_last: bool = False,
) -> Iterator[LMBatch]:
    """Yield LMBatch of `batch_size` rows (shuffled with `generator` if given, else in order)."""
    n = data.n_rows
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    for start in range(0, n, batch_size):
        rows = order[start:start + batch_size]
        if drop_last and rows.numel() < batch_size:
            return
        cidx = data.chunk_index[rows]
        present = torch.unique(cidx[cidx >= 0])  # sorted global chunk ids in this batch
        local = torch.full_like(cidx, -1)
        mask = cidx >= 0
        local[mask] = torch.searchsorted(present, cidx[mask])
        yield LMBatch(data.input_ids[rows], local, data.chunk_labels[present], present, data.pad_id)
