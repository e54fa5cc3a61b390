"""The release's weights: parameter names, state dicts and checkpoint directories.

- `RELEASE_NAMES` is the one table between the diagrams' parameter names and the release's
  state_dict keys (`release_names(L)`, `release_key(name)`); the tied embedding / LM head is one
  tensor, stored once under either `transformer.tok_emb.weight` or `transformer.lm_head.weight`.
- `check_release_state_dict` checks a state dict against the shapes a model stores
  (`Steerling.from_release`).
- `load_directory` reads a checkpoint folder (`Steerling.load`, `Steerling.from_pretrained`), in
  either layout:
    * penrose's own (`Steerling.save`): `config.json` with `model_config` / `concept_config` as
      differences from the release defaults, `vocab_size`, `variant`, ...;
    * the published one (steerling 0.2.0's `SteerlingGenerator.from_pretrained`): `config.json`
      with the model fields flat at the top level plus `interpretable`, `concept` (the concept
      config), `vocab_size`, `instruct` and the hub's keys (`model_type`, `architectures`,
      `auto_map`, `transformers_version`, `_name_or_path`, `torch_dtype`, ...; ignored).
  Weights in both: `model.safetensors`, or shards `model-0000i-of-0000n.safetensors` listed in
  `model.safetensors.index.json` (`weight_map`).

Loading checks everything it can without reading a weight — the config, the index, every shard's
header (keys, shapes, dtypes) — before anything is built, so a bad folder raises `CheckpointError`
(naming the file and the field or key) and nothing is half loaded. The model is then built on the
meta device and its parameters are the memory-mapped tensors of the files themselves
(`safetensors.safe_open`, `load_state_dict(assign=True)`): nothing is copied unless a dtype or
device is asked for, and then one tensor at a time, so peak memory stays about one copy of the
weights.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from penrose_zoo.steerling.config import (
    CONCEPT_DEFAULTS,
    LARGE_CONCEPT_THRESHOLD,
    MODEL_DEFAULTS,
    RELEASE_INSTRUCT_VOCAB_SIZE,
    RELEASE_MASK_ID,
    RELEASE_VOCAB_SIZE,
)
from penrose_zoo.steerling.schema import (
    CONCEPT_SCHEMA,
    MODEL_SCHEMA,
    PENROSE_SCHEMA,
    PUBLISHED_SCHEMA,
    CheckpointError,
    check_fields,
    check_memory,
    read_json,
)
from torch import Tensor

from penrose.errors import (
    PenroseCompileError,
    PenroseShapeError,
    PenroseWarning,
)

# ---------------------------------------------------------------------------------------------
# Diagram parameter names ↔ release state_dict keys
# ---------------------------------------------------------------------------------------------


# (diagram name, release key); "{i}" is the layer index. Every release weight is a `.weight`.
RELEASE_NAMES: tuple[tuple[str, str], ...] = (
    ("tok_emb", "transformer.tok_emb.weight"),  # = transformer.lm_head.weight (tied)
    ("layers.{i}.ln_1", "transformer.blocks.{i}.ln_1.weight"),
    ("layers.{i}.ln_2", "transformer.blocks.{i}.ln_2.weight"),
    ("layers.{i}.attn.c_attn", "transformer.blocks.{i}.attn.c_attn.weight"),
    ("layers.{i}.attn.c_proj", "transformer.blocks.{i}.attn.c_proj.weight"),
    ("layers.{i}.attn.q_norm", "transformer.blocks.{i}.attn.q_norm.weight"),
    ("layers.{i}.attn.k_norm", "transformer.blocks.{i}.attn.k_norm.weight"),
    ("layers.{i}.mlp.c_fc", "transformer.blocks.{i}.mlp.c_fc.weight"),
    ("layers.{i}.mlp.c_proj", "transformer.blocks.{i}.mlp.c_proj.weight"),
    ("ln_f", "transformer.ln_f.weight"),
    ("known_head.concept_predictor", "known_head.concept_predictor.weight"),
    ("known_head.concept_embedding", "known_head.concept_embedding.weight"),
    ("unknown_head.predictor_down", "unknown_head.predictor_down.weight"),
    ("unknown_head.predictor_up", "unknown_head.predictor_up.weight"),
    ("unknown_head.embedding_coef", "unknown_head.embedding_coef.weight"),
    ("unknown_head.embedding_basis", "unknown_head.embedding_basis.weight"),
    # the dense (not factorised) unknown head, concepts_unknown_dense.pen
    ("unknown_head.concept_predictor", "unknown_head.concept_predictor.weight"),
    ("unknown_head.concept_embedding", "unknown_head.concept_embedding.weight"),
)
TIED_KEY = "transformer.lm_head.weight"
EMBEDDING_KEY = "transformer.tok_emb.weight"


def release_names(n_layers: int) -> dict[str, str]:
    """{diagram parameter name: release key} for a model with n_layers layers."""
    out = {}
    for name, key in RELEASE_NAMES:
        if "{i}" in name:
            for i in range(n_layers):
                out[name.format(i=i)] = key.format(i=i)
        else:
            out[name] = key
    return out


def release_key(name: str) -> str:
    """The release key of one diagram parameter name ('layers.3.attn.c_attn' → ...)."""
    parts = name.split(".")
    if parts[0] == "layers" and len(parts) > 2 and parts[1].isdigit():
        return release_names(int(parts[1]) + 1)[name]
    table = release_names(0)
    if name not in table:
        raise KeyError(f"no release key for diagram parameter {name!r}")
    return table[name]


def check_release_state_dict(state_dict, want: dict[str, tuple[int, ...]], names: dict[str, str]) -> dict[str, Tensor]:
    """{diagram name: float32 tensor} from a release state dict, after checking every key, shape and
    dtype against `want` ({release key: shape}, the tied LM head once, as tok_emb); `names` is
    {diagram name: release key}. The tied tensor may come under either of its names (once, or
    twice when both hold the same values). Raises PenroseShapeError listing every problem."""
    if not isinstance(state_dict, dict):
        raise PenroseShapeError(f"state_dict must be a dict of tensors, got {type(state_dict).__name__}")
    given = dict(state_dict)
    tied = given.pop(TIED_KEY, None)
    if tied is not None and EMBEDDING_KEY not in given:  # the tied tensor stored under the LM head's name
        given[EMBEDDING_KEY], tied = tied, None
    missing = [k for k in want if k not in given]
    extra = [k for k in given if k not in want]
    problems = []
    if missing:
        problems.append("missing key(s): " + _some(missing))
    if extra:
        problems.append("unexpected key(s): " + _some(extra))
    for k, shape in want.items():
        t = given.get(k)
        if t is None:
            continue
        if not isinstance(t, Tensor):
            problems.append(f"{k} is a {type(t).__name__}, not a tensor")
        elif not t.is_floating_point():
            problems.append(f"{k} has dtype {t.dtype}; weights are floating point")
        elif tuple(t.shape) != shape:
            problems.append(f"{k} has shape {tuple(t.shape)}, expected {shape}")
    if tied is not None:
        emb = given.get(EMBEDDING_KEY)
        if not isinstance(tied, Tensor) or (isinstance(emb, Tensor) and tuple(tied.shape) != tuple(emb.shape)):
            problems.append(f"{TIED_KEY} must be the tied token embedding (shape {want[EMBEDDING_KEY]})")
        elif isinstance(emb, Tensor) and tied is not emb and not tied.is_meta and not torch.equal(tied, emb):
            problems.append(f"{TIED_KEY} differs from {EMBEDDING_KEY}, but the model ties them (weight_sharing)")
    if problems:
        raise PenroseShapeError("release state_dict does not fit the config: " + "; ".join(problems))
    inverse = {v: k for k, v in names.items()}
    return {inverse[k]: given[k].detach().to(torch.float32) for k in want}


def _some(keys, n: int = 8) -> str:
    keys = list(keys)
    return ", ".join(keys[:n]) + (f" ... ({len(keys)} in all)" if len(keys) > n else "")


# ---------------------------------------------------------------------------------------------
# config.json
# ---------------------------------------------------------------------------------------------

# The hub's keys in a published config.json (the release strips the first four); ignored.
HUB_KEYS = frozenset({
    "model_type", "architectures", "auto_map", "transformers_version", "_name_or_path", "torch_dtype", "dtype",
    "_commit_hash", "_attn_implementation", "_attn_implementation_autoset", "tie_word_embeddings", "use_cache",
    "return_dict", "bos_token_id", "eos_token_id", "pad_token_id",
})
# What other architectures call the fields a Steerling config names n_layers, n_embd, ...: a
# config holding these is another model's.
FOREIGN_KEYS = frozenset({
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
    "rope_theta", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "hidden_act", "head_dim", "rope_scaling",
    "n_positions", "n_ctx", "n_inner", "d_model", "num_layers", "ffn_dim", "word_embed_proj_dim",
})
PUBLISHED_KEYS = frozenset({"interpretable", "concept", "vocab_size", "instruct"})
_STEERLING_NAMES = re.compile(r"steerling|diffusion", re.IGNORECASE)


@dataclass
class CheckpointConfig:
    """What a checkpoint's config.json says: the configs (release field names, differences from
    the defaults or full), the vocabulary and the model options."""

    layout: str  # "penrose" (Steerling.save) or "published" (steerling 0.2.0's hub layout)
    model_config: dict
    concept_config: dict
    vocab_size: int
    options: dict = field(default_factory=dict)  # causal, large_concept_threshold
    mask_token_id: int | None = None
    instruct: bool = False
    ignored: tuple[str, ...] = ()  # hub keys and other keys read past


def read_config(path: str | Path) -> CheckpointConfig:
    """The config.json of the checkpoint folder `path`, in either layout, checked field by field
    (the sizes the diagrams draw are checked when the model is built)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint folder")
    file = path / "config.json"
    if not file.exists() and not file.is_symlink():  # a device or FIFO is read_json's to refuse
        weights = "" if any(path.glob("*.safetensors")) else f", no {SINGLE_FILE} (nor shards listed in {INDEX_FILE})"
        raise CheckpointError(f"{path}: no config.json{weights}; a checkpoint is a folder with config.json and its "
                              f"weights ({SINGLE_FILE}, or shards model-0000i-of-0000n.safetensors listed in {INDEX_FILE})")
    cfg = read_json(file)
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{file}: expected a JSON object, got {type(cfg).__name__}")
    if "model_config" in cfg or "concept_config" in cfg or "variant" in cfg:
        return _penrose_config(file, cfg)
    return _published_config(file, cfg)


def _penrose_config(file: Path, cfg: dict) -> CheckpointConfig:
    for key in ("model_config", "concept_config"):
        if not isinstance(cfg.get(key, {}), dict):
            raise CheckpointError(f"{file}: field {key!r} must be an object, got {type(cfg[key]).__name__}")
    model, concept = dict(cfg.get("model_config", {})), dict(cfg.get("concept_config", {}))
    for given, schema, prefix in ((model, MODEL_SCHEMA, "model_config."), (concept, CONCEPT_SCHEMA, "concept_config.")):
        unknown = sorted(set(given) - set(schema))
        if unknown:
            raise CheckpointError(f"{file}: unknown field(s) {', '.join(repr(prefix + k) for k in unknown)}")
        check_fields(file, given, schema, prefix)
    check_fields(file, cfg, PENROSE_SCHEMA, "")
    variant = cfg.get("variant", "block_causal")
    vocab = cfg.get("vocab_size", RELEASE_VOCAB_SIZE)
    mask = cfg.get("mask_token_id")
    if mask is not None and mask >= vocab:
        raise CheckpointError(f"{file}: field 'mask_token_id' = {mask}: expected a token id below vocab_size ({vocab})")
    _check_sizes(file, model, concept, vocab, "model_config.", "concept_config.")
    opts = {"causal": variant == "causal",
            "large_concept_threshold": cfg.get("large_concept_threshold", LARGE_CONCEPT_THRESHOLD)}
    return CheckpointConfig("penrose", model, concept, vocab, opts, mask)


def _check_sizes(file: Path, model: dict, concept: dict, vocab: int, model_prefix: str, concept_prefix: str) -> None:
    """The weights the configs make fit in memory (schema.check_memory), fields named as in the file."""
    m, c = {**MODEL_DEFAULTS, **model}, {**CONCEPT_DEFAULTS, **concept}
    paths = {k: model_prefix + k for k in MODEL_DEFAULTS} | {"concept." + k: concept_prefix + k for k in CONCEPT_DEFAULTS}
    check_memory(file, m, c, vocab, paths)


def _published_config(file: Path, cfg: dict) -> CheckpointConfig:
    def bad(field: str, why: str):
        return CheckpointError(f"{file}: field {field!r} = {cfg[field]!r}: {why}")

    model_type = cfg.get("model_type")
    if model_type is not None and not (model_type == "causal_diffusion" or _STEERLING_NAMES.search(str(model_type))):
        raise bad("model_type", "not a Steerling (causal diffusion) config")
    arch = cfg.get("architectures")
    if arch is not None:
        if not isinstance(arch, list) or not all(isinstance(a, str) and _STEERLING_NAMES.search(a) for a in arch):
            raise bad("architectures", "not a Steerling (causal diffusion) model")
    foreign = sorted(k for k in cfg if k in FOREIGN_KEYS)
    if foreign:
        raise CheckpointError(f"{file}: field(s) {', '.join(map(repr, foreign))} of another architecture; a Steerling "
                              "config names its sizes n_layers, n_embd, n_head, n_kv_heads, block_size, ... (steerling.configs)")
    if cfg.get("interpretable") is not True:
        if "interpretable" not in cfg:
            raise CheckpointError(f"{file}: no field 'interpretable'; the diagrams draw the interpretable model "
                                  "(interpretable: true, with a 'concept' config)")
        raise bad("interpretable", "the diagrams draw the interpretable model (concept heads); "
                                   "a plain causal diffusion LM has none")
    concept = cfg.get("concept")
    if not isinstance(concept, dict):
        if "concept" not in cfg:
            raise CheckpointError(f"{file}: no field 'concept' (the concept config the concept heads are built from)")
        raise bad("concept", "expected an object (the concept config)")
    model = {k: v for k, v in cfg.items() if k in MODEL_DEFAULTS and k != "model_type"}
    check_fields(file, model, MODEL_SCHEMA, "")
    unknown = sorted(set(concept) - set(CONCEPT_DEFAULTS))
    if unknown:
        raise CheckpointError(f"{file}: field 'concept' has unknown field(s) {', '.join(map(repr, unknown))}")
    check_fields(file, concept, CONCEPT_SCHEMA, "concept.")
    check_fields(file, cfg, PUBLISHED_SCHEMA, "")
    instruct = cfg.get("instruct", False)
    vocab = cfg.get("vocab_size", RELEASE_INSTRUCT_VOCAB_SIZE if instruct else RELEASE_VOCAB_SIZE)
    _check_sizes(file, model, concept, vocab, "", "concept.")
    rest = [k for k in cfg if k not in MODEL_DEFAULTS and k not in PUBLISHED_KEYS]
    other = [k for k in rest if k not in HUB_KEYS]
    if other:
        warnings.warn(f"{file}: ignoring field(s) {', '.join(map(repr, other))} (not Steerling config fields)",
                      PenroseWarning, stacklevel=3)
    return CheckpointConfig("published", model, dict(concept), vocab, {},
                            RELEASE_MASK_ID if vocab > RELEASE_MASK_ID else None, instruct, tuple(rest))


# ---------------------------------------------------------------------------------------------
# Weight files
# ---------------------------------------------------------------------------------------------

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_SHARD = re.compile(r"model-(\d+)-of-(\d+)\.safetensors")


@dataclass
class StoredTensor:
    file: Path
    shape: tuple[int, ...]
    dtype: str  # the safetensors dtype name: BF16, F32, ...


def weight_files(path: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The weight files of a checkpoint folder and, when there is an index, its weight_map."""
    index = path / INDEX_FILE
    if index.is_file():
        doc = read_json(index, max_bytes=64 << 20)  # a weight map of a many-layer model is long
        wmap = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wmap, dict) or not wmap or not all(isinstance(v, str) for v in wmap.values()):
            raise CheckpointError(f"{index}: no field 'weight_map' ({{weight name: shard file}})")
        files, missing = [], {}
        for name in dict.fromkeys(wmap.values()):
            f = path / name
            if Path(name).name != name or not f.is_file():
                missing[name] = [k for k, v in wmap.items() if v == name]
            files.append(f)
        if missing:
            raise CheckpointError(f"{index}: lists shard(s) that are not in {path}: " + "; ".join(
                f"{name} (for {len(keys)} weight(s), e.g. {keys[0]})" for name, keys in missing.items()))
        return files, wmap
    if (path / SINGLE_FILE).is_file():
        return [path / SINGLE_FILE], None
    shards = sorted(p for p in path.glob("model-*-of-*.safetensors") if _SHARD.fullmatch(p.name))
    if shards:  # shards without an index (the release reads every *.safetensors of a folder)
        m = _SHARD.fullmatch(shards[0].name)
        assert m is not None  # shards holds only names it matches
        width, n = len(m.group(1)), int(m.group(2))
        want = [path / f"model-{i:0{width}d}-of-{m.group(2)}.safetensors" for i in range(1, n + 1)]
        gone = [p.name for p in want if not p.is_file()]
        if gone:
            raise CheckpointError(f"{path}: shard(s) {', '.join(gone)} missing (and no {INDEX_FILE})")
        return want, None
    # otherwise, as the release: every *.safetensors file of the folder (penrose's own training
    # state, optimizer.safetensors, is not a weight file)
    found = sorted(p for p in path.glob("*.safetensors") if p.name != "optimizer.safetensors" and p.is_file())
    if found:
        return found, None
    raise CheckpointError(f"{path}: no weights: expected {SINGLE_FILE}, or shards model-0000i-of-0000n.safetensors "
                          f"listed in {INDEX_FILE}, or other *.safetensors files")


def stored_tensors(files: list[Path], wmap: dict[str, str] | None) -> dict[str, StoredTensor]:
    """{key: where it is, its shape and dtype}, from the files' headers (no weight is read)."""
    from safetensors import safe_open

    out: dict[str, StoredTensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():
                    s = h.get_slice(k)
                    if k in out:
                        raise CheckpointError(f"{f}: weight {k} is also in {out[k].file.name}")
                    out[k] = StoredTensor(f, tuple(s.get_shape()), s.get_dtype())
        except CheckpointError:
            raise
        except Exception as e:  # safetensors' SafetensorError, OSError: a damaged or foreign file
            raise CheckpointError(f"{f}: not a readable safetensors file ({e})") from None
    if wmap is not None:
        wrong = [(k, v) for k, v in wmap.items() if k not in out or out[k].file.name != v]
        if wrong:
            raise CheckpointError(f"{files[0].parent / INDEX_FILE}: weight(s) not in the shard the index names: "
                                  + ", ".join(f"{k} ({v})" for k, v in wrong[:8])
                                  + (f" ... ({len(wrong)} in all)" if len(wrong) > 8 else ""))
    return out


_FLOAT_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}


def check_stored(path: Path, stored: dict[str, StoredTensor], want: dict[str, tuple[int, ...]], *,
                 strict: bool = True) -> dict[str, str]:
    """{release key: stored key} of the weights to read, after checking the stored keys, shapes
    and dtypes against `want` (the tied embedding under either name). Raises CheckpointError
    naming every missing key, every unknown key (a warning with strict=False), every wrong shape
    (both shapes, and the file) and every non-float weight."""
    source = {k: k for k in want if k in stored}
    if EMBEDDING_KEY in want and EMBEDDING_KEY not in stored and TIED_KEY in stored:
        source[EMBEDDING_KEY] = TIED_KEY  # the tied tensor stored under the LM head's name
    missing = [k for k in want if k not in source]
    unknown = [k for k in stored if k not in want and k != TIED_KEY]
    problems = []
    if missing:
        problems.append("missing weight(s) " + _some(missing))
    for k, s in source.items():
        t = stored[s]
        if t.dtype not in _FLOAT_DTYPES:
            problems.append(f"{t.file.name}: {s} has dtype {t.dtype}; weights are floating point")
        elif t.shape != want[k]:
            problems.append(f"{t.file.name}: {s} has shape {t.shape}, expected {want[k]}")
    if TIED_KEY in stored and source.get(EMBEDDING_KEY) != TIED_KEY:
        t, e = stored[TIED_KEY], stored.get(EMBEDDING_KEY)
        if e is not None and t.shape != e.shape:
            problems.append(f"{t.file.name}: {TIED_KEY} has shape {t.shape}, but it is the tied token embedding "
                            f"{EMBEDDING_KEY} {e.shape}")
    if unknown:
        msg = "unknown weight(s) " + _some(unknown) + " (not parameters of this config)"
        if strict:
            problems.append(msg)
        else:
            warnings.warn(f"{path}: ignoring {msg}", PenroseWarning, stacklevel=3)
    if problems:
        raise CheckpointError(f"{path}: the weights do not fit config.json: " + "; ".join(problems))
    return source


def read_tensors(stored: dict[str, StoredTensor], source: dict[str, str], *, dtype: torch.dtype | None,
                 device: torch.device) -> dict[str, Tensor]:
    """{release key: tensor}: memory-mapped straight from the files (no copy) on the CPU in their
    stored dtype; otherwise converted or moved one tensor at a time."""
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for k, s in source.items():
        by_file.setdefault(stored[s].file, []).append(k)
    direct = device.type in ("cpu", "cuda")  # safetensors reads straight to these
    where = str(device) if device.type != "cuda" or device.index is not None else f"cuda:{torch.cuda.current_device()}"
    out: dict[str, Tensor] = {}
    for f, keys in by_file.items():
        try:
            with safe_open(str(f), framework="pt", device=where if direct else "cpu") as h:
                for k in keys:
                    t = h.get_tensor(source[k])
                    if not direct:
                        t = t.to(device)
                    out[k] = t if dtype is None or t.dtype == dtype else t.to(dtype)
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"{f}: reading the weights failed ({e})") from None
    return out


def check_finite_files(stored: dict[str, StoredTensor], keys, chunk_bytes: int = 1 << 26) -> None:
    """Every stored tensor of `keys` is finite: read from its file in chunks through one buffer
    (plain reads, not the memory map the model will use, so loading still maps the weights
    untouched); CheckpointError naming the file and the first tensor holding a NaN or ±inf."""
    import json as _json
    import struct

    by_file: dict[Path, list[str]] = {}
    for k in dict.fromkeys(keys):
        by_file.setdefault(stored[k].file, []).append(k)
    buf = bytearray(chunk_bytes)
    for f, names in by_file.items():
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = _json.loads(fh.read(n))  # safe_open has read this header already: it is well formed
            base = 8 + n
            for k in names:
                dt = _FLOAT_DTYPES[header[k]["dtype"]]
                begin, end = header[k]["data_offsets"]
                size = torch.empty((), dtype=dt).element_size()
                step = chunk_bytes // size * size
                fh.seek(base + begin)
                at = begin
                while at < end:
                    want = min(step, end - at)
                    view = memoryview(buf)[:want]
                    got = fh.readinto(view)
                    if got != want:
                        raise CheckpointError(f"{f}: tensor {k} is cut short (the file ends inside it)")
                    _check_finite(f, k, torch.frombuffer(view, dtype=dt), offset=(at - begin) // size,
                                  total=(end - begin) // size)
                    at += want


def _check_finite(file, key: str, t: Tensor, chunk: int = 1 << 24, offset: int = 0, total: int | None = None) -> None:
    """CheckpointError naming `file` and tensor `key` if `t` (entries `offset`... of a tensor of
    `total`) holds a NaN or an infinity; checked in chunks, never a second full-size tensor."""
    flat = t.reshape(-1)
    for start in range(0, flat.numel(), chunk):
        part = flat[start : start + chunk]
        if bool(torch.isfinite(part.sum())):  # a NaN or an inf makes the sum one: a finite sum clears the chunk fast
            continue
        finite = torch.isfinite(part)  # an inf sum may be an overflow: look entry by entry
        if not bool(finite.all()):
            first = start + int((~finite).nonzero()[0, 0])
            raise CheckpointError(
                f"{file}: tensor {key} holds a non-finite value ({float(flat[first])} at entry {offset + first:,} of "
                f"{total if total is not None else flat.numel():,}); a model with it generates nothing meaningful "
                "(load with allow_nonfinite=True to inspect it anyway)")


def load_directory(cls, path, *, dtype: torch.dtype | str | None = None, device=None, strict: bool = True,
                   allow_nonfinite: bool = False, **kw):
    """A `cls` (Steerling) model read from the checkpoint folder `path` (either layout, see the
    module docstring) onto `device` (default CPU). dtype None: float32 for penrose's layout (what
    `Steerling.save` writes), as stored for the published one (the token embedding's dtype when
    the files mix dtypes). `kw`: Steerling's options (causal, large_concept_threshold), over
    what config.json says. Everything is checked before a weight is read; on any error nothing is
    returned (CheckpointError naming the file and the field or key). Weights holding NaN or ±inf
    are refused as they are read (naming the tensor) unless `allow_nonfinite=True`."""
    given = dtype
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise CheckpointError(f"dtype must be a floating-point torch dtype (or its name), got {given!r}")
    path = Path(path)
    cfg = read_config(path)
    files, wmap = weight_files(path)
    stored = stored_tensors(files, wmap)
    device = torch.device("cpu" if device is None else device)
    opts = {**cfg.options, **kw}
    try:
        with torch.device("meta"):
            model = cls(cfg.model_config, cfg.concept_config, cfg.vocab_size, **opts)
    except PenroseCompileError as e:
        raise CheckpointError(f"{path / 'config.json'}: {e.message}") from None
    source = check_stored(path, stored, model.expected_release_shapes(), strict=strict)
    if dtype is None:
        dtype = torch.float32 if cfg.layout == "penrose" else _FLOAT_DTYPES[stored[source[EMBEDDING_KEY]].dtype]
    if not allow_nonfinite:
        check_finite_files(stored, source.values())
    tensors = read_tensors(stored, source, dtype=dtype, device=device)
    if TIED_KEY in stored and source[EMBEDDING_KEY] != TIED_KEY:  # stored twice: the same tensor?
        (lm,) = read_tensors(stored, {TIED_KEY: TIED_KEY}, dtype=dtype, device=device).values()
        if not torch.equal(lm, tensors[EMBEDDING_KEY]):
            raise CheckpointError(f"{path}: {TIED_KEY} differs from {EMBEDDING_KEY}, but the model ties them "
                                  "(weight_sharing)")
        del lm
    inverse = {v: k for k, v in model._names.items()}
    model.net.load_state_dict({inverse[k]: t for k, t in tensors.items()}, strict=True, assign=True)
    model.mask_token_id = cfg.mask_token_id if cfg.mask_token_id is not None else model.mask_token_id
    model.instruct = cfg.instruct
    model.checkpoint_layout = cfg.layout
    return model
