"""Offline tokenizers for training Steerling on small corpora: byte-level, or a corpus-trained BPE.

Nothing here downloads anything. Two kinds, one interface (`encode`, `decode`, `save`, `load`,
`vocab_size` and the four special ids):

  ByteTokenizer   ids 0..255 are the UTF-8 bytes; the special tokens follow:
                      256 <|pad|>   257 <|bos|>   258 <|eoc|> (end of chunk)   259 <|mask|>
                  vocab_size 260. Lossless on any text; no training.

  BPETokenizer    byte-level BPE trained with the `tokenizers` library on the given texts
                  (ids 0..base−1, base = the trained vocabulary, ≤ vocab_size − 4); the special
                  tokens follow in the same order: base + 0 pad, + 1 bos, + 2 eoc, + 3 mask.
                  (The release's vocabulary has the same shape: cl100k_base, then pad, bos,
                  end-of-chunk and mask appended.)

The special tokens are never part of the text-to-ids mapping: `encode` cannot produce them, so a
text that happens to contain the string "<|eoc|>" is encoded as ordinary bytes, and no chunk can
end early. Callers append them (see penrose_zoo.steerling.lm_data). `decode` renders them as their names,
or drops them with skip_special=True.

Saving: one JSON file (conventionally `tokenizer.json` next to a checkpoint), holding
{"format": "penrose-steerling-tokenizer", "version": 1, "kind": "byte" | "bpe",
 "special_tokens": [...], "bpe": <the `tokenizers` JSON, for kind "bpe">}.
`load_tokenizer(path)` returns the right class.

    >>> tok = ByteTokenizer()
    >>> tok.encode("hé")
    [104, 195, 169]
    >>> tok.decode([104, 195, 169, tok.eoc_id])
    'hé<|eoc|>'
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Sequence

__all__ = [
    "SPECIAL_TOKENS",
    "ByteTokenizer",
    "BPETokenizer",
    "load_tokenizer",
    "TOKENIZER_FORMAT",
]

#: Special tokens, in id order after the base vocabulary.
SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eoc|>", "<|mask|>")
TOKENIZER_FORMAT = "penrose-steerling-tokenizer"


class _Base:
    """Shared special-token bookkeeping; `base_size` is the number of ordinary ids."""

    kind = ""
    base_size: int

    @property
    def vocab_size(self) -> int:
        return self.base_size + len(SPECIAL_TOKENS)

    @property
    def pad_id(self) -> int:
        return self.base_size

    @property
    def bos_id(self) -> int:
        return self.base_size + 1

    @property
    def eoc_id(self) -> int:
        """End-of-chunk token id ([EOC] in the post)."""
        return self.base_size + 2

    @property
    def mask_id(self) -> int:
        """[MASK]: the diffusion objective's mask token and the Integrated Gradients baseline."""
        return self.base_size + 3

    @property
    def special_ids(self) -> dict[str, int]:
        return {name: self.base_size + i for i, name in enumerate(SPECIAL_TOKENS)}

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def _decode_base(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of `ids`; special ids become their names (or vanish with skip_special)."""
        out: list[str] = []
        run: list[int] = []
        for i in (int(x) for x in ids):
            if 0 <= i < self.base_size:
                run.append(i)
                continue
            if not self.base_size <= i < self.vocab_size:
                raise ValueError(f"token id {i} out of range for a vocabulary of {self.vocab_size}")
            if run:
                out.append(self._decode_base(run))
                run = []
            if not skip_special:
                out.append(SPECIAL_TOKENS[i - self.base_size])
        if run:
            out.append(self._decode_base(run))
        return "".join(out)

    def _payload(self) -> dict:
        return {}

    def save(self, path: str | os.PathLike) -> Path:
        """Write the tokenizer as one JSON file; returns the path. A directory gets tokenizer.json."""
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        doc = {"format": TOKENIZER_FORMAT, "version": 1, "kind": self.kind,
               "special_tokens": list(SPECIAL_TOKENS), **self._payload()}
        path.write_text(json.dumps(doc, ensure_ascii=False))
        return path


class ByteTokenizer(_Base):
    """UTF-8 bytes as ids 0..255, then pad 256, bos 257, eoc 258, mask 259."""

    kind = "byte"
    base_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def _decode_base(self, ids: Sequence[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=260)"


class BPETokenizer(_Base):
    """Byte-level BPE from the `tokenizers` library, special ids appended after its vocabulary.

    >>> tok = BPETokenizer.train(["the cat sat on the mat"] * 20, vocab_size=300)
    >>> tok.decode(tok.encode("the mat")) == "the mat"
    True
    """

    kind = "bpe"

    def __init__(self, hf_tokenizer):
        self._tok = hf_tokenizer
        self.base_size = hf_tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 4096, *, min_frequency: int = 2) -> "BPETokenizer":
        """Train on `texts` (use the training split only). vocab_size counts the 4 special ids;
        the trained vocabulary may come out smaller when the corpus has few distinct pairs."""
        try:
            from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("BPETokenizer needs the `tokenizers` package (pip install tokenizers)") from e
        if vocab_size < 256 + len(SPECIAL_TOKENS):
            raise ValueError(f"vocab_size must be at least {256 + len(SPECIAL_TOKENS)} (bytes + specials), got {vocab_size}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size - len(SPECIAL_TOKENS),
            min_frequency=min_frequency,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=[],
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def _decode_base(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def _payload(self) -> dict:
        return {"bpe": json.loads(self._tok.to_str())}

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


def load_tokenizer(path: str | os.PathLike) -> ByteTokenizer | BPETokenizer:
    """Read a tokenizer written by `save` (a file, or a directory holding tokenizer.json)."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable tokenizer JSON file ({e})") from e
    if not isinstance(doc, dict) or doc.get("format") != TOKENIZER_FORMAT:
        raise ValueError(f"{path}: not a {TOKENIZER_FORMAT} file")
    if tuple(doc.get("special_tokens", ())) != SPECIAL_TOKENS:
        raise ValueError(f"{path}: special tokens {doc.get('special_tokens')} differ from {list(SPECIAL_TOKENS)}")
    if doc["kind"] == "byte":
        return ByteTokenizer()
    if doc["kind"] == "bpe":
        from tokenizers import Tokenizer

        return BPETokenizer(Tokenizer.from_str(json.dumps(doc["bpe"])))
    raise ValueError(f"{path}: unknown tokenizer kind {doc['kind']!r}")
