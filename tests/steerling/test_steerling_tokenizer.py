"""The release's tokenizer (cl100k_base + Steerling's special ids), the one byte tokenizer, and
the choice of tokenizer a checkpoint makes (penrose_zoo.steerling.tokenizer)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from penrose_zoo.steerling import tokenizer as T
from penrose_zoo.steerling.tokenizer import (BPETokenizer, ByteTokenizer, SteerlingTokenizer, TokenizerError,
                                             TokenizerUnavailable, load_tokenizer, tokenizer_for)

# ids from the release's documentation (steerling/data/tokenizer.py and its README), not from our code
HELLO = [9906, 1917]
COURT = [791, 5590, 21989, 389, 279, 2383, 13]
PAD, BOS, EOC, MASK, EOT_TEXT = 100277, 100278, 100279, 100280, 100257


@pytest.fixture(scope="module")
def release():
    try:
        return SteerlingTokenizer()
    except TokenizerUnavailable as e:  # the zoo extra installs bpe-openai
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def instruct(release):
    return SteerlingTokenizer(instruct=True)


# ------------------------------------------------------------------------------------------
# the release's tokenizer
# ------------------------------------------------------------------------------------------

def test_cl100k_ids_are_the_releases(release):
    assert release.encode("Hello world", add_special_tokens=False) == HELLO
    assert release.encode("The court ruled on the law.", add_special_tokens=False) == COURT
    assert release.encode("Hello world") == [BOS] + HELLO + [EOT_TEXT]  # the release's default
    assert release.encode_batch(["Hello world", "The court ruled on the law."]) == [HELLO, COURT]
    assert release.prompt_ids("Hello world") == HELLO  # as the release's generator encodes a prompt


def test_release_special_ids(release, instruct):
    assert (release.pad_id, release.bos_id, release.eoc_id, release.mask_id) == (PAD, BOS, EOC, MASK)
    assert release.eos_id == release.eos_token_id == EOT_TEXT
    assert (release.pad_token_id, release.bos_token_id, release.endofchunk_token_id, release.mask_token_id) == \
        (PAD, BOS, EOC, MASK)
    assert release.vocab_size == 100281 and release.base_size == 100277
    assert (release.start_header_id, release.end_header_id, release.eot_id) == (None, None, None)
    assert instruct.vocab_size == 100284
    assert (instruct.start_header_id, instruct.end_header_id, instruct.eot_id) == (100281, 100282, 100283)
    assert (instruct.pad_id, instruct.bos_id, instruct.eoc_id, instruct.mask_id) == (PAD, BOS, EOC, MASK)
    assert release.special_ids == {"<|endoftext|>": EOT_TEXT, "<|pad|>": PAD, "<|bos|>": BOS,
                                   "<|endofchunk|>": EOC, "<|mask|>": MASK}


def test_special_token_text_is_plain_text(release):
    text = "<|endoftext|> <|bos|><|endofchunk|><|mask|><|pad|>"
    ids = release.encode(text, add_special_tokens=False)
    assert not {EOT_TEXT, PAD, BOS, EOC, MASK} & set(ids)
    assert release.decode(ids) == text
    full = release.encode(text)
    assert full[0] == BOS and full[-1] == EOT_TEXT and full[1:-1] == ids


def test_decode_drops_special_ids_by_default(release, instruct):
    ids = [BOS] + HELLO + [EOT_TEXT, EOC, MASK, PAD]
    assert release.decode(ids) == "Hello world"
    assert release.decode(ids, skip_special_tokens=False) == \
        "<|bos|>Hello world<|endoftext|><|endofchunk|><|mask|><|pad|>"
    assert instruct.decode([100281] + HELLO + [100282, 100283]) == "Hello world"
    assert instruct.decode([100281, 100282, 100283], skip_special_tokens=False) == \
        "<|start_header_id|><|end_header_id|><|eot_id|>"
    with pytest.raises(TokenizerError, match="token id 100281 out of range for a vocabulary of 100281"):
        release.decode([100281])
    torch = pytest.importorskip("torch")
    assert release.decode(torch.tensor([BOS] + COURT)) == "The court ruled on the law."


@pytest.mark.parametrize("text", ["Hello world", "The court ruled on the law.", "naïve café — 日本語 ✓ 🙂",
                                  "  leading and trailing  \n\ttabs\r\n", "", "1234567890 + x**2 == y"])
def test_release_round_trip(release, text):
    assert release.decode(release.encode(text)) == text
    assert release.decode(release.encode(text, add_special_tokens=False), skip_special_tokens=False) == text


def test_release_tokenizer_saves_and_loads(tmp_path, instruct):
    path = instruct.save(tmp_path)
    doc = json.loads(path.read_text())
    assert (path.name, doc["kind"], doc["instruct"]) == ("tokenizer.json", "release", True)
    again = load_tokenizer(path)
    assert isinstance(again, SteerlingTokenizer) and again.instruct and again.vocab_size == 100284
    assert again.encode("Hello world") == [BOS] + HELLO + [EOT_TEXT]


# ------------------------------------------------------------------------------------------
# where cl100k_base comes from
# ------------------------------------------------------------------------------------------

@pytest.fixture
def fresh_backend(monkeypatch):
    T.cl100k_base.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    T.cl100k_base.cache_clear()


def test_no_backend_is_a_clear_error(fresh_backend):
    fresh_backend.setitem(sys.modules, "bpe_openai", None)
    fresh_backend.setitem(sys.modules, "tiktoken", None)
    with pytest.raises(TokenizerUnavailable, match=r"pip install bpe-openai.*bpe-openai is not installed; tiktoken is not installed"):
        SteerlingTokenizer()
    assert issubclass(TokenizerUnavailable, ImportError)


def test_tiktoken_is_the_fallback(fresh_backend):
    class FakeEncoding:
        n_vocab = 100277

        def encode_ordinary(self, text):
            return [len(text)]

    fake = types.ModuleType("tiktoken")
    fake.get_encoding = lambda name: FakeEncoding() if name == "cl100k_base" else None
    fresh_backend.setitem(sys.modules, "bpe_openai", None)
    fresh_backend.setitem(sys.modules, "tiktoken", fake)
    assert SteerlingTokenizer().encode("abc") == [BOS, 3, EOT_TEXT]

    def offline(name):
        raise ConnectionError("no network")

    T.cl100k_base.cache_clear()
    fake.get_encoding = offline
    with pytest.raises(TokenizerUnavailable, match="tiktoken could not load its cl100k_base ranks.*no network.*TIKTOKEN_CACHE_DIR"):
        SteerlingTokenizer()


def test_wrong_sized_encoding_is_refused():
    class Small:
        n_vocab = 50257

    with pytest.raises(TokenizerError, match="cl100k_base should have 100,277 ids; this encoding has 50,257"):
        SteerlingTokenizer(encoding=Small())


# ------------------------------------------------------------------------------------------
# one byte tokenizer
# ------------------------------------------------------------------------------------------

def test_generate_byte_tokenizer_is_the_tokenizer_modules():
    from penrose_zoo.steerling import generate

    gen = generate.ByteTokenizer()
    assert type(gen) is ByteTokenizer
    assert gen.encode("hi") == [257, 104, 105]  # generation's defaults: bos first ...
    assert gen.decode([257, 104, 105, 258, 259]) == "hi"  # ... special ids dropped
    assert gen.eos_id == gen.eoc_id == 258 and gen.n_bytes == 256
    plain = ByteTokenizer()
    assert plain.encode("hi") == [104, 105] and plain.decode([257, 104, 105]) == "<|bos|>hi"
    assert plain.encode("hi", add_special_tokens=True) == gen.encode("hi")
    assert plain.decode([257, 104], skip_special_tokens=True) == plain.decode([257, 104], skip_special=True) == "h"
    assert gen.decode([257, 104], skip_special_tokens=False) == "<|bos|>h"
    assert plain.prompt_ids("hi") == gen.prompt_ids("hi") == [257, 104, 105]
    assert generate.ByteTokenizer(add_special_tokens=False).encode("hi") == [104, 105]


# ------------------------------------------------------------------------------------------
# the tokenizer a checkpoint needs
# ------------------------------------------------------------------------------------------

def _folder(tmp_path: Path, name: str, config: dict | None, tokenizer=None) -> Path:
    d = tmp_path / name
    d.mkdir()
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    if isinstance(tokenizer, str):
        (d / "tokenizer.json").write_text(tokenizer)
    elif tokenizer is not None:
        tokenizer.save(d / "tokenizer.json")
    return d


def test_tokenizer_for_reads_the_vocabulary(tmp_path, release):
    assert type(tokenizer_for(_folder(tmp_path, "bytes", {"vocab_size": 260}))) is ByteTokenizer
    tok = tokenizer_for(_folder(tmp_path, "rel", {"vocab_size": 100281, "instruct": False}))
    assert isinstance(tok, SteerlingTokenizer) and not tok.instruct
    tok = tokenizer_for(_folder(tmp_path, "ins", {"vocab_size": 100284}))
    assert isinstance(tok, SteerlingTokenizer) and tok.instruct and tok.vocab_size == 100284
    assert isinstance(tokenizer_for(_folder(tmp_path, "default", {"model_config": {}})), SteerlingTokenizer)
    assert tokenizer_for(types.SimpleNamespace(vocab_size=100284)).instruct
    assert type(tokenizer_for(types.SimpleNamespace(vocab_size=260))) is ByteTokenizer
    # a foreign tokenizer.json (the hub's own) next to the release's vocabulary: the release tokenizer
    tok = tokenizer_for(_folder(tmp_path, "hub", {"vocab_size": 100281}, '{"model": {"type": "BPE"}}'))
    assert isinstance(tok, SteerlingTokenizer)


def test_tokenizer_for_refuses_what_does_not_fit(tmp_path, release):
    with pytest.raises(TokenizerError, match=r"vocabulary of 1,000 ids is neither the release tokenizer's \(100,281, "
                                             r"or 100,284 with instruct\) nor the byte tokenizer's \(260\)"):
        tokenizer_for(_folder(tmp_path, "odd", {"vocab_size": 1000}))
    with pytest.raises(TokenizerError, match="has a vocabulary of 260 ids but .*'s model has 1,000"):
        tokenizer_for(_folder(tmp_path, "mismatch", {"vocab_size": 1000}, ByteTokenizer()))
    with pytest.raises(TokenizerError, match="has a vocabulary of 260 ids but .*'s model has 100,281"):
        tokenizer_for(_folder(tmp_path, "rel_bytes", {"vocab_size": 100281}, ByteTokenizer()))
    with pytest.raises(TokenizerError, match="not a penrose-steerling-tokenizer file"):
        tokenizer_for(_folder(tmp_path, "foreign", {"vocab_size": 260}, '{"model": {}}'))
    with pytest.raises(TokenizerError, match="instruct=True but the vocabulary is 100,281"):
        tokenizer_for(_folder(tmp_path, "flag", {"vocab_size": 100281, "instruct": True}))
    with pytest.raises(TokenizerError, match="no config.json"):
        tokenizer_for(_folder(tmp_path, "empty", None))
    with pytest.raises(TokenizerError, match="no checkpoint folder"):
        tokenizer_for(tmp_path / "missing")
    with pytest.raises(TokenizerError, match="vocabulary of 300 ids"):
        tokenizer_for(types.SimpleNamespace(vocab_size=300))
    # vocab_size= (the loaded model's) wins over config.json
    assert type(tokenizer_for(_folder(tmp_path, "override", {"vocab_size": 1000}), vocab_size=260)) is ByteTokenizer


@pytest.fixture(scope="module")
def bpe_checkpoint(tmp_path_factory):
    pytest.importorskip("tokenizers")
    from penrose_zoo.steerling import Steerling
    from penrose_zoo.steerling.cli import TINY_CONCEPTS, TINY_MODEL

    bpe = BPETokenizer.train([f"the cat sat on the mat {i} and the dog ran" for i in range(40)], vocab_size=300)
    assert bpe.vocab_size != 260
    root = tmp_path_factory.mktemp("bpe") / "ckpt"
    model = Steerling.from_release_config(TINY_MODEL, TINY_CONCEPTS, bpe.vocab_size, causal=True, seed=0)
    model.save(root)
    bpe.save(root / "tokenizer.json")
    return root, bpe


def test_generate_uses_the_checkpoints_tokenizer(bpe_checkpoint, monkeypatch, capsys):
    import penrose_zoo.steerling.generate as g
    from penrose_zoo.steerling.cli import main

    root, bpe = bpe_checkpoint
    assert isinstance(tokenizer_for(root), BPETokenizer) and tokenizer_for(root).vocab_size == bpe.vocab_size
    seen = {}
    real = g.generate

    def spy(model, prompt, n, **kw):
        seen["prompt"], seen["out"] = list(prompt), real(model, prompt, n, **kw)
        seen["eos"], seen["banned"] = kw.get("eos_id"), kw.get("banned")
        return seen["out"]

    monkeypatch.setattr(g, "generate", spy)
    assert main(["generate", "--checkpoint", str(root), "--prompt", "the cat sat", "--temperature", "0",
                 "--max-new-tokens", "5"]) == 0
    assert seen["prompt"] == [bpe.bos_id] + bpe.encode("the cat sat")
    assert seen["prompt"] != ByteTokenizer().prompt_ids("the cat sat")
    assert (seen["eos"], seen["banned"]) == (bpe.eoc_id, [bpe.pad_id, bpe.bos_id, bpe.mask_id])
    n = len(seen["prompt"])
    assert capsys.readouterr().out == bpe.decode(seen["out"][n:], skip_special_tokens=True) + "\n"


def test_generate_refuses_a_tokenizer_of_another_vocabulary(bpe_checkpoint, tmp_path, capsys):
    import shutil

    from penrose_zoo.steerling.cli import main

    root, bpe = bpe_checkpoint
    other = tmp_path / "other"
    shutil.copytree(root, other)
    ByteTokenizer().save(other / "tokenizer.json")
    assert main(["generate", "--checkpoint", str(other), "--prompt", "x", "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert f"vocabulary of 260 ids but {other}'s model has {bpe.vocab_size}" in err
    (other / "tokenizer.json").unlink()  # no tokenizer.json and no known vocabulary: refused too
    assert main(["generate", "--checkpoint", str(other), "--prompt", "x", "--max-new-tokens", "2"]) == 1
    assert f"vocabulary of {bpe.vocab_size} ids is neither" in capsys.readouterr().err
