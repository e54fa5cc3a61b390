"""Steerling's tokenizers: the release's (cl100k_base), byte-level, or a corpus-trained BPE.

Nothing here downloads anything. Three kinds, one interface (`encode`, `decode`, `encode_batch`,
`prompt_ids`, `save`, `vocab_size` and the special ids), and one way to pick the right one for a
checkpoint (`tokenizer_for`):

  SteerlingTokenizer  the release's vocabulary: cl100k_base (ids 0..100,276, its own
                      <|endoftext|> = 100257 among them), then
                          100277 <|pad|>   100278 <|bos|>   100279 <|endofchunk|>   100280 <|mask|>
                      vocab_size 100,281; with instruct=True also
                          100281 <|start_header_id|>   100282 <|end_header_id|>   100283 <|eot_id|>
                      vocab_size 100,284. cl100k_base comes from the `bpe-openai` package (it
                      ships the ranks; offline), else from `tiktoken` when its ranks are cached.

  ByteTokenizer       ids 0..255 are the UTF-8 bytes; the special tokens follow:
                          256 <|pad|>   257 <|bos|>   258 <|eoc|> (end of chunk)   259 <|mask|>
                      vocab_size 260. Lossless on any text; no training.

  BPETokenizer        byte-level BPE trained with the `tokenizers` library on the given texts
                      (ids 0..base−1, base = the trained vocabulary, ≤ vocab_size − 4); the
                      special tokens follow in the same order: base + 0 pad, + 1 bos, + 2 eoc,
                      + 3 mask — the release's shape, with a smaller base.

Special tokens are never part of the text-to-ids mapping: a text that contains "<|eoc|>" or
"<|endoftext|>" is encoded as ordinary text, so no chunk can end early.

    encode(text, add_special_tokens=...)   the text's ids; with add_special_tokens, [bos] + ids,
                                           and for the release tokenizer [bos] + ids +
                                           [<|endoftext|>] (exactly the release's encode)
    decode(ids, skip_special_tokens=...)   special ids become their names, or are dropped
                                           (the release's <|endoftext|> counts as special)
    encode_batch(texts)                    plain ids, no special tokens (training packs them)
    prompt_ids(text)                       what generation starts from: [bos] + ids for the
                                           training tokenizers (their rows start with bos), the
                                           plain ids for the release's (its generator does so)

The defaults of the two keywords are the release's for SteerlingTokenizer (add, skip) and "off"
for the training tokenizers (`ByteTokenizer(add_special_tokens=True, skip_special_tokens=True)`
gives the release's defaults; `skip_special=` is accepted as another name for
skip_special_tokens). `eos_id` is where generation stops: <|endoftext|> for the release, the
end-of-chunk id for the training tokenizers.

Saving: one JSON file (conventionally `tokenizer.json` next to a checkpoint), holding
{"format": "penrose-steerling-tokenizer", "version": 1, "kind": "byte" | "bpe" | "release",
 "special_tokens": [...], "bpe": <the `tokenizers` JSON, for kind "bpe">, "instruct": <for
 kind "release">}. `load_tokenizer(path)` returns the right class.

Which tokenizer a checkpoint needs (`tokenizer_for(folder or model)`): its `tokenizer.json`
when it has one; else the release tokenizer when its vocabulary is the release's (100,281, or
100,284 with instruct); else bytes when it is 260; anything else, or a tokenizer whose
vocabulary differs from the model's, is a `TokenizerError` naming both sizes.

    >>> tok = ByteTokenizer()
    >>> tok.encode("hé")
    [104, 195, 169]
    >>> tok.decode([104, 195, 169, tok.eoc_id])
    'hé<|eoc|>'
    >>> tok.decode([tok.bos_id, 104, 105, tok.eoc_id], skip_special_tokens=True)
    'hi'
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from pathlib import Path
from typing import Iterable, Sequence

from penrose.errors import PenroseError

__all__ = [
    "SPECIAL_TOKENS",
    "RELEASE_SPECIAL_TOKENS",
    "RELEASE_INSTRUCT_TOKENS",
    "CL100K_BASE_SIZE",
    "ENDOFTEXT_ID",
    "RELEASE_VOCAB_SIZE",
    "RELEASE_INSTRUCT_VOCAB_SIZE",
    "BYTE_VOCAB_SIZE",
    "TOKENIZER_FORMAT",
    "TokenizerError",
    "TokenizerUnavailable",
    "SteerlingTokenizer",
    "ByteTokenizer",
    "BPETokenizer",
    "cl100k_base",
    "load_tokenizer",
    "tokenizer_for",
    "check_vocab",
]

#: Special tokens of the training tokenizers, in id order after the base vocabulary.
SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eoc|>", "<|mask|>")
#: The release's special tokens after cl100k_base (steerling/data/tokenizer.py), then the instruct ones.
RELEASE_SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|endofchunk|>", "<|mask|>")
RELEASE_INSTRUCT_TOKENS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
CL100K_BASE_SIZE = 100277
ENDOFTEXT_ID = 100257  # cl100k_base's <|endoftext|>, the release's eos
RELEASE_VOCAB_SIZE = CL100K_BASE_SIZE + len(RELEASE_SPECIAL_TOKENS)  # 100,281
RELEASE_INSTRUCT_VOCAB_SIZE = RELEASE_VOCAB_SIZE + len(RELEASE_INSTRUCT_TOKENS)  # 100,284
BYTE_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)  # 260
TOKENIZER_FORMAT = "penrose-steerling-tokenizer"


class TokenizerError(PenroseError, ValueError):
    """A tokenizer file that cannot be read, an id out of range, or a tokenizer that does not fit
    a checkpoint (a ValueError too, for callers that catch those)."""


class TokenizerUnavailable(PenroseError, ImportError):
    """Neither bpe-openai nor a usable tiktoken is installed, so cl100k_base cannot be built."""


class _Base:
    """Shared special-token bookkeeping; `base_size` is the number of ordinary ids, the special
    tokens follow it in the order of `special_tokens` (pad, bos, end of chunk, mask, ...)."""

    kind = ""
    base_size: int
    special_tokens: tuple[str, ...] = SPECIAL_TOKENS
    add_special_default = False  # encode's add_special_tokens when not given
    skip_special_default = False  # decode's skip_special_tokens when not given
    appends_eos = False  # encode(add_special_tokens=True) ends with eos (the release's <|endoftext|>)
    prompt_bos = True  # prompt_ids starts with bos

    def _set_defaults(self, add_special_tokens: bool | None, skip_special_tokens: bool | None) -> None:
        if add_special_tokens is not None:
            self.add_special_default = bool(add_special_tokens)
        if skip_special_tokens is not None:
            self.skip_special_default = bool(skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.base_size + len(self.special_tokens)

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
    def eos_id(self) -> int:
        """Where generation stops: the end-of-chunk id (the release's tokenizer: <|endoftext|>)."""
        return self.eoc_id

    # the release's attribute names
    pad_token_id = pad_id
    bos_token_id = bos_id
    eos_token_id = eos_id
    endofchunk_token_id = eoc_id
    mask_token_id = mask_id

    @property
    def special_ids(self) -> dict[str, int]:
        """{name: id} of the special tokens after the base vocabulary."""
        return {name: self.base_size + i for i, name in enumerate(self.special_tokens)}

    def _special_in_base(self) -> frozenset[int]:
        """Ids below base_size that decode treats as special (the release's <|endoftext|>)."""
        return frozenset()

    def _encode_base(self, text: str) -> list[int]:
        raise NotImplementedError

    def _decode_base(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """The ids of `text` (special-token strings in it are plain text); with
        add_special_tokens, [bos] + ids (+ [eos] for the release's tokenizer)."""
        ids = self._encode_base(text)
        add = self.add_special_default if add_special_tokens is None else add_special_tokens
        if add:
            ids = [self.bos_id] + ids + ([self.eos_id] if self.appends_eos else [])
        return ids

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        """Plain ids of each text, never a special token (training appends bos / eoc itself)."""
        return [self._encode_base(t) for t in texts]

    def prompt_ids(self, text: str) -> list[int]:
        """The ids generation starts from: [bos] + ids, or the plain ids for the release's
        tokenizer (as the release's generator encodes a prompt)."""
        return ([self.bos_id] if self.prompt_bos else []) + self._encode_base(text)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool | None = None, *,
               skip_special: bool | None = None) -> str:
        """Text of `ids` (a list, tensor or array); special ids become their names, or vanish
        with skip_special_tokens (skip_special is the same switch under its older name)."""
        skip = skip_special_tokens if skip_special_tokens is not None else skip_special
        skip = self.skip_special_default if skip is None else bool(skip)
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        special_low = self._special_in_base()
        out: list[str] = []
        run: list[int] = []
        for i in (int(x) for x in ids):
            if 0 <= i < self.base_size:
                if not (skip and i in special_low):
                    run.append(i)
                continue
            if not self.base_size <= i < self.vocab_size:
                raise TokenizerError(f"token id {i} out of range for a vocabulary of {self.vocab_size}")
            if run:
                out.append(self._decode_base(run))
                run = []
            if not skip:
                out.append(self.special_tokens[i - self.base_size])
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
               "special_tokens": list(self.special_tokens), **self._payload()}
        from penrose.io import atomic_write_text

        atomic_write_text(path, json.dumps(doc, ensure_ascii=False))  # penrose.io's one mode rule
        return path


class ByteTokenizer(_Base):
    """UTF-8 bytes as ids 0..255, then pad 256, bos 257, eoc 258, mask 259.

    The keywords set encode's and decode's defaults (both off unless given)."""

    kind = "byte"
    base_size = 256
    n_bytes = 256

    def __init__(self, *, add_special_tokens: bool | None = None, skip_special_tokens: bool | None = None):
        self._set_defaults(add_special_tokens, skip_special_tokens)

    def _encode_base(self, text: str) -> list[int]:
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

    def __init__(self, hf_tokenizer, *, add_special_tokens: bool | None = None,
                 skip_special_tokens: bool | None = None):
        self._tok = hf_tokenizer
        self.base_size = hf_tokenizer.get_vocab_size(with_added_tokens=True)
        self._set_defaults(add_special_tokens, skip_special_tokens)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 4096, *, min_frequency: int = 2) -> "BPETokenizer":
        """Train on `texts` (use the training split only). vocab_size counts the 4 special ids;
        the trained vocabulary may come out smaller when the corpus has few distinct pairs."""
        try:
            from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("BPETokenizer needs the `tokenizers` package (pip install tokenizers)") from e
        if vocab_size < BYTE_VOCAB_SIZE:
            raise ValueError(f"vocab_size must be at least {BYTE_VOCAB_SIZE} (bytes + specials), got {vocab_size}")
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

    def _encode_base(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def _decode_base(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def _payload(self) -> dict:
        return {"bpe": json.loads(self._tok.to_str())}

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


@functools.lru_cache(maxsize=None)
def cl100k_base():
    """The cl100k_base encoding (tiktoken's interface): from `bpe-openai`, which ships it, else
    from `tiktoken` (which downloads its ranks at first use, so only a cached copy works
    offline). TokenizerUnavailable, saying what to install, when neither works."""
    tried = []
    with warnings.catch_warnings():  # bpe-openai 0.1.4 reads its ranks with importlib.resources.open_binary
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import bpe_openai

            return bpe_openai.get_encoding("cl100k_base")
        except ImportError:
            tried.append("bpe-openai is not installed")
    try:
        import tiktoken
    except ImportError:
        tried.append("tiktoken is not installed")
    else:
        try:
            return tiktoken.get_encoding("cl100k_base")
        except Exception as e:  # network or cache failure: tiktoken raises many kinds
            tried.append(f"tiktoken could not load its cl100k_base ranks ({type(e).__name__}: {e}); it downloads "
                         "them at first use, so offline it needs them cached (TIKTOKEN_CACHE_DIR)")
    raise TokenizerUnavailable("the release tokenizer needs the cl100k_base vocabulary: `pip install bpe-openai` "
                               "(it ships cl100k_base and works offline), or tiktoken with its ranks cached ("
                               + "; ".join(tried) + ")")


class SteerlingTokenizer(_Base):
    """The release's tokenizer: cl100k_base, then pad, bos, end-of-chunk, mask (and with
    instruct the three chat tokens). Defaults as the release: encode adds [bos] … [<|endoftext|>],
    decode drops special ids.

    `encoding`: a tiktoken-style cl100k_base object (encode_ordinary, encode_ordinary_batch,
    decode, n_vocab) to use instead of `cl100k_base()`.

    >>> tok = SteerlingTokenizer()                       # doctest: +SKIP
    >>> tok.encode("Hello world")                        # doctest: +SKIP
    [100278, 9906, 1917, 100257]
    """

    kind = "release"
    base_size = CL100K_BASE_SIZE
    add_special_default = True
    skip_special_default = True
    appends_eos = True
    prompt_bos = False

    def __init__(self, instruct: bool = False, *, encoding=None, add_special_tokens: bool | None = None,
                 skip_special_tokens: bool | None = None):
        self.instruct = bool(instruct)
        self.special_tokens = RELEASE_SPECIAL_TOKENS + (RELEASE_INSTRUCT_TOKENS if self.instruct else ())
        self._enc = cl100k_base() if encoding is None else encoding
        n = int(getattr(self._enc, "n_vocab", -1))
        if n != CL100K_BASE_SIZE:
            raise TokenizerError(f"cl100k_base should have {CL100K_BASE_SIZE:,} ids; this encoding has {n:,}")
        self._set_defaults(add_special_tokens, skip_special_tokens)

    @property
    def eos_id(self) -> int:
        return ENDOFTEXT_ID

    eos_token_id = eos_id

    @property
    def special_ids(self) -> dict[str, int]:
        return {"<|endoftext|>": ENDOFTEXT_ID, **super().special_ids}

    def _special_in_base(self) -> frozenset[int]:
        return frozenset({ENDOFTEXT_ID})

    def _chat_id(self, k: int) -> int | None:
        return self.base_size + len(RELEASE_SPECIAL_TOKENS) + k if self.instruct else None

    @property
    def start_header_id(self) -> int | None:
        return self._chat_id(0)

    @property
    def end_header_id(self) -> int | None:
        return self._chat_id(1)

    @property
    def eot_id(self) -> int | None:
        return self._chat_id(2)

    def _encode_base(self, text: str) -> list[int]:
        return list(self._enc.encode_ordinary(text))

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [list(x) for x in self._enc.encode_ordinary_batch(list(texts))]

    def _decode_base(self, ids: Sequence[int]) -> str:
        return self._enc.decode(list(ids))

    def _payload(self) -> dict:
        return {"encoding": "cl100k_base", "instruct": self.instruct}

    def __repr__(self) -> str:
        return f"SteerlingTokenizer(instruct={self.instruct}, vocab_size={self.vocab_size})"


def _read_doc(path: Path) -> dict:
    from penrose.errors import PenroseError
    from penrose.io import read_json

    try:
        doc = read_json(path, max_bytes=256 << 20, max_depth=32)
    except PenroseError as e:
        raise TokenizerError(f"{path}: not a readable tokenizer JSON file ({e.message})") from None
    if not isinstance(doc, dict) or doc.get("format") != TOKENIZER_FORMAT:
        raise TokenizerError(f"{path}: not a {TOKENIZER_FORMAT} file")
    return doc


def load_tokenizer(path: str | os.PathLike) -> ByteTokenizer | BPETokenizer | SteerlingTokenizer:
    """Read a tokenizer written by `save` (a file, or a directory holding tokenizer.json), as
    untrusted input: each field of its JSON type (`"instruct": "false"` is not false), the
    format's version, the special tokens exactly; for a BPE tokenizer, the `tokenizers` model a
    BPE whose ids (vocabulary and added tokens) are exactly 0..n−1, each once — a missing id
    would shift the special ids onto a word (text encoded as <|pad|>), an id past the end would
    index outside the model's embedding. Every problem a TokenizerError naming the file and the
    field."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    doc = _read_doc(path)
    version = doc.get("version")
    if type(version) is not int or version != 1:
        raise TokenizerError(f"{path}: field 'version' = {version!r}: expected 1")
    kind = doc.get("kind")
    if kind not in ("byte", "bpe", "release"):
        raise TokenizerError(f"{path}: field 'kind' = {kind!r}: expected 'byte', 'bpe' or 'release'")
    instruct = doc.get("instruct", False)
    if kind == "release":
        if not isinstance(instruct, bool):
            raise TokenizerError(f"{path}: field 'instruct' = {instruct!r}: expected true or false")
        want = RELEASE_SPECIAL_TOKENS + (RELEASE_INSTRUCT_TOKENS if instruct else ())
    else:
        want = SPECIAL_TOKENS
    special = doc.get("special_tokens", [])
    if not isinstance(special, list) or tuple(special) != want:
        raise TokenizerError(f"{path}: field 'special_tokens' = {special!r}: expected {list(want)}")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "release":
        return SteerlingTokenizer(instruct=instruct)
    bpe = doc.get("bpe")
    if not isinstance(bpe, dict):
        raise TokenizerError(f"{path}: field 'bpe' must be an object (the tokenizers library's model)")
    n = _check_bpe_ids(path, bpe)
    from tokenizers import Tokenizer

    try:
        tok = BPETokenizer(Tokenizer.from_str(json.dumps(bpe)))
    except Exception as e:  # noqa: BLE001 - the tokenizers library's own error: a damaged file
        raise TokenizerError(f"{path}: field 'bpe' is not a tokenizer the tokenizers library reads ({e})") from None
    if tok.base_size != n:  # (the library's count of what it read: the ids checked above, nothing more)
        raise TokenizerError(f"{path}: field 'bpe' holds {n:,} ids but the tokenizers library reads {tok.base_size:,}")
    return tok


def _check_bpe_ids(path: Path, bpe: dict) -> int:
    """The number of ids of a `tokenizers` BPE document, after checking that its model is a BPE
    and that the ids of `model.vocab` and `added_tokens` are whole numbers making 0..n−1, each
    once; a TokenizerError naming the field otherwise."""
    model = bpe.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE":
        raise TokenizerError(f"{path}: field 'bpe.model' must be a BPE model (its 'type' \"BPE\")")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerError(f"{path}: field 'bpe.model.vocab' must be an object of tokens and their ids")
    added = bpe.get("added_tokens", [])
    if not isinstance(added, list) or not all(isinstance(a, dict) for a in added):
        raise TokenizerError(f"{path}: field 'bpe.added_tokens' must be a list of objects")
    owner: dict[int, str] = {}
    entries = [(f"bpe.model.vocab[{k!r}]", v) for k, v in vocab.items()]
    entries += [(f"bpe.added_tokens[{i}].id", a.get("id")) for i, a in enumerate(added)]
    for field, i in entries:
        if type(i) is not int or i < 0:
            raise TokenizerError(f"{path}: field {field} = {i!r}: expected a whole number of at least 0")
        if i in owner:
            raise TokenizerError(f"{path}: field {field} = {i}: the id of {owner[i]} too; each id names one token")
        owner[i] = field
    n = len(owner)
    past = [i for i in owner if i >= n]
    if past:  # as many ids as tokens, all distinct: one past the end means one missing below it
        missing = min(set(range(n)) - set(owner))
        raise TokenizerError(f"{path}: field {owner[min(past)]} = {min(past)} is past the end of the {n:,} ids, and "
                             f"id {missing} is missing; the ids are 0..{n - 1}, each once (the special tokens follow)")
    return n


def check_vocab(tok, vocab_size: int, where: str = "the checkpoint") -> None:
    """TokenizerError unless the tokenizer's vocabulary is exactly the model's."""
    if tok.vocab_size != int(vocab_size):
        raise TokenizerError(f"the tokenizer ({tok!r}) has a vocabulary of {tok.vocab_size:,} ids but {where}'s model "
                             f"has {int(vocab_size):,}; they must be equal")


def _by_vocab(vocab: int, where: str, instruct=None):
    """The tokenizer a vocabulary size implies when no tokenizer.json says otherwise."""
    if instruct is not None and not isinstance(instruct, bool):
        raise TokenizerError(f"{where}: config.json's field 'instruct' = {instruct!r}: expected true or false")
    if vocab in (RELEASE_VOCAB_SIZE, RELEASE_INSTRUCT_VOCAB_SIZE):
        is_instruct = vocab == RELEASE_INSTRUCT_VOCAB_SIZE
        if instruct is not None and bool(instruct) != is_instruct:
            raise TokenizerError(f"{where}: config.json says instruct={bool(instruct)} but the vocabulary is {vocab:,} "
                                 f"(the release's is {RELEASE_VOCAB_SIZE:,}, {RELEASE_INSTRUCT_VOCAB_SIZE:,} with instruct)")
        return SteerlingTokenizer(instruct=is_instruct)
    if vocab == BYTE_VOCAB_SIZE:
        return ByteTokenizer()
    raise TokenizerError(f"{where}: no tokenizer.json, and its vocabulary of {vocab:,} ids is neither the release "
                         f"tokenizer's ({RELEASE_VOCAB_SIZE:,}, or {RELEASE_INSTRUCT_VOCAB_SIZE:,} with instruct) nor the "
                         f"byte tokenizer's ({BYTE_VOCAB_SIZE}); save the tokenizer it was trained with as tokenizer.json")


def tokenizer_for(source, *, vocab_size: int | None = None):
    """The tokenizer a checkpoint needs. `source`: a checkpoint folder or a loaded model (anything
    with `vocab_size`).

    A folder: its tokenizer.json when it has one (ours; a foreign tokenizer.json is passed over
    only when the vocabulary is the release's), else by the vocabulary — config.json's
    `vocab_size` (or `vocab_size=`, the loaded model's) — the release tokenizer for 100,281 /
    100,284 (config.json's `instruct`, when present, must agree), bytes for 260. A model: by its
    vocabulary. TokenizerError for any other size, or when the tokenizer's vocabulary is not the
    model's (naming both sizes)."""
    if not isinstance(source, (str, os.PathLike)):
        vocab = int(source.vocab_size if vocab_size is None else vocab_size)
        return _by_vocab(vocab, f"the model (vocab_size {vocab:,})")
    folder = Path(source)
    if not folder.is_dir():
        raise TokenizerError(f"no checkpoint folder {str(folder)!r}")
    cfg: dict = {}
    cfg_path = folder / "config.json"
    if cfg_path.is_file():
        from penrose.errors import PenroseError
        from penrose.io import read_json

        try:
            cfg = read_json(cfg_path)
        except PenroseError as e:
            raise TokenizerError(f"{cfg_path}: not readable JSON ({e.message})") from None
        if not isinstance(cfg, dict):
            raise TokenizerError(f"{cfg_path}: expected a JSON object")
    elif vocab_size is None:
        raise TokenizerError(f"{folder}: no config.json to read the vocabulary size from")
    if vocab_size is None:
        vocab = cfg.get("vocab_size", RELEASE_VOCAB_SIZE)
        if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
            raise TokenizerError(f"{cfg_path}: field 'vocab_size' = {vocab!r}: expected a whole number of at least 1")
    else:
        vocab = int(vocab_size)
    tok_path = folder / "tokenizer.json"
    if tok_path.is_file():
        try:
            _read_doc(tok_path)
        except TokenizerError:
            if vocab not in (RELEASE_VOCAB_SIZE, RELEASE_INSTRUCT_VOCAB_SIZE):
                raise
        else:
            tok = load_tokenizer(tok_path)
            check_vocab(tok, vocab, str(folder))
            return tok
    return _by_vocab(vocab, str(folder), cfg.get("instruct"))
