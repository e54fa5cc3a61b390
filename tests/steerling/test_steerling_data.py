"""Tests for penrose_zoo.steerling.tokenizer and penrose_zoo.steerling.lm_data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from penrose_zoo.data import FORTUNES_DIR, DataError, is_validation
from penrose_zoo.steerling.lm_data import (
    LabelledChunk,
    iterate_lm_batches,
    load_concept_corpus,
    pack_chunks,
    token_concept_labels,
)
from penrose_zoo.steerling.tokenizer import SPECIAL_TOKENS, BPETokenizer, ByteTokenizer, load_tokenizer

HAVE_FORTUNES = Path(FORTUNES_DIR, "science").is_file()
needs_fortunes = pytest.mark.skipif(not HAVE_FORTUNES, reason=f"fortunes corpus not at {FORTUNES_DIR}")


def write_corpus(root: Path, files: dict[str, list[str]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, entries in files.items():
        (root / name).write_text("\n%\n".join(entries) + "\n%\n")
    return root


def small_corpus(tmp_path: Path, n: int = 30) -> Path:
    return write_corpus(tmp_path / "corpus", {
        "apples": [f"apple number {i} is red and crisp" for i in range(n)],
        "boats": [f"boat {i} sails on the blue sea" for i in range(n)],
        "clocks": [f"clock {i} ticks at midnight" for i in range(n)],
    })


# ------------------------------------------------------------------------------------------
# tokenizer
# ------------------------------------------------------------------------------------------

def test_byte_tokenizer_ids_and_round_trip():
    tok = ByteTokenizer()
    assert tok.vocab_size == 260
    assert (tok.pad_id, tok.bos_id, tok.eoc_id, tok.mask_id) == (256, 257, 258, 259)
    text = "Ünïcödé ✓ and <|eoc|> as plain text"
    ids = tok.encode(text)
    assert max(ids) < 256  # a special token's *string* never becomes its id
    assert tok.decode(ids) == text
    assert tok.decode([tok.bos_id] + ids + [tok.eoc_id], skip_special=True) == text
    assert tok.decode([tok.eoc_id, tok.pad_id]) == "<|eoc|><|pad|>"
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([260])


def test_byte_tokenizer_save_load(tmp_path):
    path = ByteTokenizer().save(tmp_path)
    assert path.name == "tokenizer.json"
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, ByteTokenizer) and tok.encode("ab") == [97, 98]


def test_bpe_tokenizer_train_save_load(tmp_path):
    pytest.importorskip("tokenizers")
    texts = [f"the quick brown fox {i} jumps over the lazy dog" for i in range(50)]
    tok = BPETokenizer.train(texts, vocab_size=320)
    assert tok.vocab_size <= 320
    assert list(tok.special_ids.values()) == list(range(tok.base_size, tok.base_size + 4))
    assert tok.mask_id == tok.vocab_size - 1
    text = "the lazy fox — naïve <|mask|>"
    ids = tok.encode(text)
    assert max(ids) < tok.base_size  # no special id from text
    assert len(tok.encode("the quick brown fox")) < len("the quick brown fox")  # merges learned
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eoc_id]) == text + "<|eoc|>"
    tok.save(tmp_path / "tok.json")
    again = load_tokenizer(tmp_path / "tok.json")
    assert isinstance(again, BPETokenizer)
    assert again.encode(text) == ids and again.vocab_size == tok.vocab_size


def test_load_tokenizer_rejects_other_json(tmp_path):
    (tmp_path / "x.json").write_text('{"model": {}}')
    with pytest.raises(ValueError, match="not a penrose-steerling-tokenizer"):
        load_tokenizer(tmp_path / "x.json")


# ------------------------------------------------------------------------------------------
# corpus and split
# ------------------------------------------------------------------------------------------

def test_load_concept_corpus_labels_and_split(tmp_path):
    root = small_corpus(tmp_path)
    corpus = load_concept_corpus(root)
    assert corpus.concept_names == ("apples", "boats", "clocks")
    everything = corpus.train + corpus.val
    assert len(everything) == 90
    for ch in everything:
        want = {"apple": 0, "boat": 1, "clock": 2}[ch.text.split()[0]]
        assert ch.concepts == (want,)
    # the fixed, documented split: penrose_zoo.data.is_validation on the text
    assert all(is_validation(c.text) for c in corpus.val)
    assert not any(is_validation(c.text) for c in corpus.train)
    assert load_concept_corpus(root) == corpus  # deterministic


def test_duplicate_text_gets_both_labels_and_concept_of(tmp_path):
    root = write_corpus(tmp_path / "c", {
        "a": ["shared text"] + [f"a only {i}" for i in range(20)],
        "b": ["shared text"] + [f"b only {i}" for i in range(20)],
        "junk": [f"junk {i}" for i in range(20)],
    })
    corpus = load_concept_corpus(root, concept_of={"a": "alpha", "b": ["beta", "alpha"], "junk": None},
                                 val_fraction=0.3)
    assert corpus.concept_names == ("alpha", "beta")
    shared = [c for c in corpus.train + corpus.val if c.text == "shared text"]
    assert len(shared) == 1 and shared[0].concepts == (0, 1)
    assert corpus.n_unlabelled == 20


def test_unlabelled_corpus_is_a_data_error(tmp_path):
    root = small_corpus(tmp_path)
    with pytest.raises(DataError, match="unlabelled corpus") as e:
        load_concept_corpus(root, concept_of={"apples": None})
    assert e.value.path == str(root)


def test_empty_directory_and_empty_file_are_data_errors(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="empty directory"):
        load_concept_corpus(empty)
    root = small_corpus(tmp_path)
    (root / "nothing").write_text("%\n%\n")
    with pytest.raises(DataError, match="no entries") as e:
        load_concept_corpus(root)
    assert e.value.path.endswith("nothing")


def test_broken_separator_names_file_and_line(tmp_path):
    root = small_corpus(tmp_path)
    (root / "broken").write_text("one entry\n%\nanother\n %%\nthird\n")
    with pytest.raises(DataError, match="malformed separator") as e:
        load_concept_corpus(root)
    assert e.value.path.endswith("broken") and e.value.line == 4


def test_split_leaving_one_side_empty_is_a_data_error(tmp_path):
    root = write_corpus(tmp_path / "tiny", {"a": ["just one entry"]})
    with pytest.raises(DataError, match="left the (training|validation) side empty"):
        load_concept_corpus(root)


# ------------------------------------------------------------------------------------------
# packing and batches
# ------------------------------------------------------------------------------------------

def test_pack_chunks_layout():
    tok = ByteTokenizer()
    chunks = [LabelledChunk("abc", (0,)), LabelledChunk("defgh", (1,)), LabelledChunk("x" * 20, (0, 2))]
    data = pack_chunks(chunks, tok, seq_len=8, n_concepts=3, shuffle_seed=None)
    assert data.input_ids.shape[1] == 8
    assert torch.equal(data.chunk_labels, torch.tensor([[1., 0, 0], [0, 1, 0], [1, 0, 1]]))
    ids, idx = data.input_ids, data.chunk_index
    # every row starts with bos, which belongs to no chunk
    assert (ids[:, 0] == tok.bos_id).all() and (idx[:, 0] == -1).all()
    # pad belongs to no chunk; every non-pad, non-bos token belongs to one
    assert ((ids == tok.pad_id) == ((idx == -1) & (ids != tok.bos_id))).all()
    # each chunk's tokens, in row order, are its bytes followed by exactly one eoc at the end
    for c, ch in enumerate(chunks):
        toks = ids[idx == c].tolist()
        assert toks == list(ch.text.encode()) + [tok.eoc_id]
    # whole chunks are not split when they fit: "abc"+eoc (4) fits row 0, "defgh"+eoc (6) does not
    assert idx[0].tolist() == [-1, 0, 0, 0, 0, -1, -1, -1]
    assert idx[1].tolist() == [-1] + [1] * 6 + [-1]
    # the long chunk is cut into 7-token pieces; only its last piece ends in eoc
    long_rows = (idx == 2).any(1).nonzero().flatten().tolist()
    assert len(long_rows) == 3
    assert (ids == tok.eoc_id).sum() == 3


def test_pack_chunks_shuffles_deterministically():
    tok = ByteTokenizer()
    chunks = [LabelledChunk(f"chunk {i}", (i % 2,)) for i in range(40)]
    a = pack_chunks(chunks, tok, 32, n_concepts=2, shuffle_seed=1)
    b = pack_chunks(chunks, tok, 32, n_concepts=2, shuffle_seed=1)
    c = pack_chunks(chunks, tok, 32, n_concepts=2, shuffle_seed=None)
    assert torch.equal(a.input_ids, b.input_ids) and not torch.equal(a.input_ids, c.input_ids)
    # labels stay attached to chunks whatever the order
    for data in (a, c):
        for r in range(data.n_rows):
            for ci in data.chunk_index[r].unique().tolist():
                if ci >= 0:
                    toks = data.input_ids[r][data.chunk_index[r] == ci].tolist()
                    assert bytes(toks[:-1]).decode() == chunks[ci].text


def test_pack_rejects_bad_concept_ids():
    with pytest.raises(ValueError, match="n_concepts"):
        pack_chunks([LabelledChunk("a", (3,))], ByteTokenizer(), 8, n_concepts=2)


def test_batches_have_local_chunk_indices():
    tok = ByteTokenizer()
    chunks = [LabelledChunk(f"text number {i}", (i % 3,)) for i in range(50)]
    data = pack_chunks(chunks, tok, 48, n_concepts=3)
    g = torch.Generator().manual_seed(0)
    seen = 0
    for batch in iterate_lm_batches(data, 3, g):
        assert batch.input_ids.shape[1] == 48
        c = batch.chunk_labels.shape[0]
        assert batch.chunk_index.max() == c - 1
        assert torch.equal(batch.chunk_labels, data.chunk_labels[batch.chunk_ids])
        # local -> global mapping is consistent with the packed data
        glob = torch.where(batch.chunk_index >= 0, batch.chunk_ids[batch.chunk_index.clamp_min(0)], -1)
        assert torch.equal(batch.valid, glob >= 0)
        tl = batch.token_labels()
        assert tl.shape == (*batch.input_ids.shape, 3)
        assert (tl[~batch.valid] == 0).all()
        assert torch.equal(tl, token_concept_labels(batch.chunk_index, batch.chunk_labels))
        seen += batch.input_ids.shape[0]
    assert seen == data.n_rows


@needs_fortunes
def test_fortunes_pipeline():
    corpus = load_concept_corpus(FORTUNES_DIR, ["science", "law", "food"])
    assert corpus.concept_names == ("food", "law", "science")
    n = len(corpus.train) + len(corpus.val)
    assert 0.15 < len(corpus.val) / n < 0.25
    tok = ByteTokenizer()
    data = pack_chunks(corpus.val, tok, 256, n_concepts=corpus.n_concepts)
    assert data.n_chunks == len(corpus.val)
    assert (data.input_ids == tok.eoc_id).sum() == len(corpus.val)
    assert (data.chunk_labels.sum(1) >= 1).all()
    # rows are reasonably full (packing, not one chunk per row)
    assert (data.input_ids != tok.pad_id).float().mean() > 0.7


def test_special_token_names_are_documented_order():
    assert SPECIAL_TOKENS == ("<|pad|>", "<|bos|>", "<|eoc|>", "<|mask|>")
