"""One schema for every field a Steerling checkpoint's config.json holds, checked before anything
is built (`penrose_zoo.steerling.release.read_config`, and penrose's own training state).

Each field has a JSON type (true/false, a whole number, a number, a string), a range, whether
null is allowed, and for numbers finiteness (NaN and ±Infinity, which Python's JSON reader
accepts, are refused). A violation is a `CheckpointError` naming the file and the field's path
in the file (`concept.block_size` in the published layout, `concept_config.block_size` in
penrose's own), the value and what was expected. Sizes whose weights would not fit in memory
are refused by `check_memory`, naming the fields and the bytes (not a zoo diagram). JSON files are
read by `penrose.io.read_json`: at most `MAX_JSON_BYTES`, nested at most `MAX_JSON_DEPTH` deep,
no key twice in one object.

    >>> check_fields("config.json", {"block_size": 0}, MODEL_SCHEMA, "")
    Traceback (most recent call last):
    ...
    penrose_zoo.steerling.schema.CheckpointError: config.json: field 'block_size' = 0: expected a whole number from 1 to 1,048,576
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from penrose.errors import PenroseError


class CheckpointError(PenroseError):
    """A checkpoint folder that cannot be loaded; the message names the file and the field or key."""


MAX_JSON_BYTES = 1 << 20  # config.json, train.json, concepts.json, the shard index: at most 1 MiB
MAX_JSON_DEPTH = 32
SIZE_MAX = 1 << 40  # any size field: beyond, no tensor of it could be built (check_memory says more)


@dataclass(frozen=True)
class Field:
    """A config field: `kind` bool | int | float | str; ints and floats within [lo, hi]; `choices`
    for strings; `null` whether JSON null is allowed; `whole`: a float that must be a whole number."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    null: bool = False
    choices: tuple = ()

    def problem(self, v) -> str | None:
        """Why `v` is not a valid value (None: it is)."""
        if v is None:
            return None if self.null else f"expected {self.want()}, not null"
        if self.kind == "bool":
            return None if isinstance(v, bool) else f"expected {self.want()}"
        if self.kind == "str":
            if not isinstance(v, str):
                return f"expected {self.want()}"
            return None if not self.choices or v in self.choices else f"expected {self.want()}"
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"expected {self.want()}"
        if isinstance(v, float) and not math.isfinite(v):
            return f"expected {self.want()} (a finite number)"
        if self.kind == "int" and not isinstance(v, int):
            return f"expected {self.want()}"
        if (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
            return f"expected {self.want()}"
        return None

    def want(self) -> str:
        if self.kind == "bool":
            return "true or false"
        if self.kind == "str":
            return "one of " + ", ".join(map(repr, self.choices)) if self.choices else "a string"
        what = "a whole number" if self.kind == "int" else "a number"
        if self.lo is not None and self.hi is not None:
            what += f" from {_num(self.lo)} to {_num(self.hi)}"
        elif self.lo is not None:
            what += f" of at least {_num(self.lo)}" if self.lo != 0 or self.kind != "float" else " of at least 0"
        return what + (" (or null)" if self.null else "")


def _num(x) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def _size(hi=SIZE_MAX, null=False, lo=1) -> Field:
    return Field("int", lo, hi, null)


# steerling 0.2.0's CausalDiffusionConfig (the released 8B's values are config.MODEL_DEFAULTS)
MODEL_SCHEMA: dict[str, Field] = {
    "model_type": Field("str"), "interpretable": Field("bool"),
    "n_layers": _size(10_000), "n_head": _size(1 << 16), "n_embd": _size(), "block_size": _size(1 << 20),
    "n_kv_heads": _size(1 << 16, null=True), "diff_block_size": _size(1 << 20),
    "use_rms_norm": Field("bool"), "norm_eps": Field("float", 1e-30, 1), "norm_order": Field("str", choices=("post", "pre")),
    "use_qk_norm": Field("bool"), "use_rope": Field("bool"), "rope_base": Field("float", 1, 1e12),
    "rope_full_precision": Field("bool"), "mlp_type": Field("str"), "activation": Field("str"),
    "mlp_ratio": _size(1 << 10), "intermediate_size": _size(null=True), "use_bias": Field("bool"),
    "clip_qkv": Field("float", 1e-30, 1e9, null=True), "weight_sharing": Field("bool"),
}
# steerling 0.2.0's ConceptConfig (config.CONCEPT_DEFAULTS)
CONCEPT_SCHEMA: dict[str, Field] = {
    "n_concepts": _size(), "n_unknown_concepts": _size(null=True), "max_concepts": _size(1 << 20),
    "concept_dim": _size(), "use_attention_known": Field("bool"), "use_attention_unknown": Field("bool"),
    "topk_known": _size(null=True), "topk_known_features": _size(null=True), "use_unknown": Field("bool"),
    "factorize_unknown": Field("bool"), "factorize_rank": _size(), "unknown_topk": _size(null=True),
    "use_epsilon_correction": Field("bool"), "block_size": _size(1 << 30), "pad_multiple": _size(1 << 20),
    "topk_on_logits": Field("bool"), "store_unknown_weights": Field("bool"), "apply_topk_to_unknown": Field("bool"),
    "inject_layer": _size(10_000, lo=0), "inject_alpha": Field("float", -1e6, 1e6),
}
# the top level of penrose's own layout (Steerling.save), besides model_config / concept_config
PENROSE_SCHEMA: dict[str, Field] = {
    "vocab_size": _size(1 << 31), "variant": Field("str", choices=("block_causal", "causal")),
    "large_concept_threshold": _size(lo=0), "mask_token_id": _size(1 << 31, null=True, lo=0),
}
# the top level of the published layout, besides the model fields and `concept`
PUBLISHED_SCHEMA: dict[str, Field] = {
    "interpretable": Field("bool"), "instruct": Field("bool"), "vocab_size": _size(1 << 31),
}


def read_json(file, what: str = "a JSON file", max_bytes: int = MAX_JSON_BYTES):
    """The JSON document in `file`, within the limits (`penrose.io.read_json`), as CheckpointError."""
    from penrose.io import read_json as _read

    try:
        return _read(file, max_bytes=max_bytes, max_depth=MAX_JSON_DEPTH)
    except PenroseError as e:
        raise CheckpointError(e.message) from None


def check_fields(file, values: dict, schema: dict[str, Field], prefix: str, error=None) -> None:
    """Every field of `values` that `schema` names against its Field (CheckpointError, or the
    `error` class given, naming `file` and `prefix + name`); fields the schema does not name are
    the caller's business."""
    for name, v in values.items():
        f = schema.get(name)
        if f is None:
            continue
        why = f.problem(v)
        if why:
            raise (error or CheckpointError)(f"{file}: field {prefix + name!r} = {_show(v)}: {why}")


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def check_memory(file, m: dict, c: dict, vocab: int, paths: dict[str, str], error=None) -> None:
    """The weights the configs `m`, `c` (defaults filled in) would make, as float32, fit in
    penrose's limits (`penrose.checker.LIMITS`: per tensor and in all): else a CheckpointError
    naming the fields that size the largest weight, their values and the bytes. `paths` maps a
    field name ("n_embd", "concept.n_concepts") to its path in the file."""
    from penrose.checker import LIMITS, _bytes
    from penrose.tables import Limits

    E, H = m["n_embd"], m["n_head"]
    G = m["n_kv_heads"] if m["n_kv_heads"] is not None else H
    D = E // H if H and E >= H else 1
    F = m["intermediate_size"] if m["intermediate_size"] is not None else m["mlp_ratio"] * E
    pm = c["pad_multiple"]
    n, u, j = -(-c["n_concepts"] // pm) * pm, -(-(c["n_unknown_concepts"] or 0) // pm) * pm, c["factorize_rank"]  # rows as stored
    L = m["n_layers"]
    # (weight, entries, fields that size it, how many of it)
    weights = [
        ("transformer.tok_emb", vocab * E, ("vocab_size", "n_embd"), 1),
        ("attn.c_attn", (E + 2 * G * D) * E, ("n_embd", "n_kv_heads", "n_head"), L),
        ("attn.c_proj", E * E, ("n_embd",), L),
        ("mlp.c_fc", 2 * F * E, ("intermediate_size" if m["intermediate_size"] is not None else "mlp_ratio", "n_embd"), L),
        ("mlp.c_proj", F * E, ("intermediate_size" if m["intermediate_size"] is not None else "mlp_ratio", "n_embd"), L),
        ("known_head.concept_predictor", n * E, ("concept.n_concepts", "n_embd"), 2),
    ]
    if c["factorize_unknown"]:
        weights += [("unknown_head.predictor_up", u * j, ("concept.n_unknown_concepts", "concept.factorize_rank"), 2),
                    ("unknown_head.predictor_down", j * E, ("concept.factorize_rank", "n_embd"), 2)]
    else:
        weights += [("unknown_head.concept_predictor", u * E, ("concept.n_unknown_concepts", "n_embd"), 2)]

    def fields(names) -> str:
        shown = []
        for k in names:
            value = c[k.removeprefix("concept.")] if k.startswith("concept.") else vocab if k == "vocab_size" else m[k]
            shown.append(f"{paths.get(k, k)!r} = {value:,}")
        return ", ".join(shown)

    per = LIMITS.value("tensor_bytes")
    big = max(weights, key=lambda w: w[1])
    if 4 * big[1] > per:
        raise (error or CheckpointError)(f"{file}: the weight {big[0]} sized by {fields(big[2])} would take {_bytes(4 * big[1])} "
                              f"({4 * big[1]:,} bytes) as float32, beyond the limit of {_bytes(per)} per tensor; "
                              f"{Limits.how_to_raise('tensor_bytes')}")
    total = sum(4 * entries * count for _, entries, _, count in weights)
    limit = LIMITS.value("total_bytes")
    if total > limit:
        share = max(weights, key=lambda w: w[1] * w[3])
        raise (error or CheckpointError)(f"{file}: the weights would take {_bytes(total)} ({total:,} bytes) as float32 in all, "
                              f"beyond the limit of {_bytes(limit)}; the largest share is {share[0]} × {share[3]}, sized by "
                              f"{fields(share[2] + (('n_layers',) if share[3] == L and L > 1 else ()))}; "
                              f"{Limits.how_to_raise('total_bytes')}")
