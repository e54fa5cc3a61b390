"""Nulls and baselines for the known-answer claims (penrose_zoo.steerling.known_answer):
`penrose steerling known-answer --null/--baselines/--layer`, `penrose steerling nulls`.

A claim of the concept module is evidence only against what a model without the claimed
mechanism scores on the same measurement. The nulls, each a model that should lose the claim:

  shuffled_labels  trained on the same text with the chunks' label sets permuted across chunks
                   (`shuffle_labels`): the labels no longer say which concept a chunk carries;
                   measured against the planted truth (not the labels it was trained on).
  lambda0          trained with the concept-loss weight λ_concept = 0 (the other losses kept).
  random_init      the checkpoint's configuration, initialised from its seed and never trained
                   (`reinitialised`).
  shuffled_k       the trained model with its known concept embeddings K permuted across concepts
                   (a derangement: no concept keeps its own row; `shuffle_known_embeddings`);
                   detection is untouched, attribution and steering read another concept's K.
  detector-only    attribution by the detector alone: the known concept with the largest chunk
                   presence, no logits involved (reported beside held-out attribution precision).

The steering baselines, each matched in fluency to the model's own edit (`match_strength`: the
strength bisected until the mean KL(p_edit ‖ p) of the next-token distributions over validation
rows equals the model edit's):

  logit_bias           + b on the logits of the concept's word tokens (`word_token_ids`).
  activation_addition  α · (mean h of tokens in chunks carrying c − mean h of the others), the
                       hidden state read at layer ℓ, added to the residual stream at layer ℓ at
                       every position (`mean_difference`, `residual_added`).
  layer_injection      s · K_c added to the residual stream at layer ℓ: the concept's own
                       embedding injected inside the network instead of after it.

Layer ℓ counts transformer blocks: 0 adds before the first block, n_layers after the last (before
the final norm). `aggregate` gives per-seed statistics (mean, spread, a bootstrap interval of the
mean over seeds); `specificity` the matrix inject c → effect on every concept's words.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

__all__ = ["NULLS", "TRAINED_NULLS", "BASELINES", "Edit", "shuffle_labels", "shuffle_known_embeddings",
           "reinitialised", "residual_added", "word_token_ids", "mean_difference", "edit_logits", "edit_kl",
           "match_strength", "specificity", "aggregate", "detector_precision"]

#: the nulls known_answer applies to a checkpoint, and those trained as their own checkpoints
NULLS = ("random_init", "shuffled_k")
TRAINED_NULLS = ("shuffled_labels", "lambda0")
BASELINES = ("logit_bias", "activation_addition", "layer_injection")


def shuffle_labels(src: str | Path, out: str | Path, *, seed: int = 0, replace: bool = False) -> Path:
    """A copy of the planted corpus in `src` whose chunks carry each other's label sets (a random
    permutation of the label tuples over chunks, seeded): the same text, the same label frequencies,
    no link between a chunk's labels and its words. The truth (`concepts`, spans) is kept, so
    known-answer still measures against what is planted."""
    from penrose_zoo.steerling.planted import load_planted, write_planted

    corpus = load_planted(src)
    labels = [c.labels for c in corpus.chunks]
    random.Random(seed).shuffle(labels)
    chunks = tuple(dataclasses.replace(c, labels=lab) for c, lab in zip(corpus.chunks, labels))
    return write_planted(dataclasses.replace(corpus, chunks=chunks), out, replace=replace)


def _known_table(model) -> torch.Tensor:
    return model.net.known_head.concept_embedding


@torch.no_grad()
def shuffle_known_embeddings(model, seed: int = 0) -> list[int]:
    """Permute the known concept embeddings K across concepts in place, a derangement (concept i gets
    the row of concept perm[i] ≠ i); returns perm."""
    n = model.sizes["c"]
    if n < 2:
        raise ValueError("shuffling K across concepts needs at least 2 known concepts")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    perm = [0] * n
    for i in range(n):  # a cycle through a random order: no fixed point
        perm[order[i]] = order[(i + 1) % n]
    K = _known_table(model)
    K[:n] = K[:n][torch.tensor(perm)].clone()
    return perm


def reinitialised(model, seed: int = 0):
    """A model of the same configuration, initialised from `seed` and never trained."""
    from penrose_zoo.steerling.model import Steerling

    fresh = Steerling(model.model_config, model.concept_config, model.vocab_size, causal=model.variant == "causal",
                      large_concept_threshold=model.large_concept_threshold, seed=seed)
    fresh.mask_token_id = model.mask_token_id
    return fresh.to(model.lm_head_weight().device).eval()


def _check_layer(model, layer: int) -> int:
    n = model.sizes["L"]
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= n:
        raise ValueError(f"layer must be a whole number from 0 to {n} (the model's layers), got {layer!r}")
    return layer


@contextlib.contextmanager
def residual_added(model, layer: int, vector: torch.Tensor | None) -> Iterator[None]:
    """Within the block, every forward pass of `model` adds `vector` (e,) to the residual stream at
    `layer` (0: before the first block; ℓ: after block ℓ), at every position. None: no edit."""
    layer = _check_layer(model, layer)
    if vector is None:
        yield
        return
    blocks = model.net.layers
    if layer == 0:
        handle = blocks[0].register_forward_pre_hook(  # the block's first argument is the residual stream
            lambda mod, args: (args[0] + vector.to(args[0].dtype), *args[1:]))
    else:
        handle = blocks[layer - 1].register_forward_hook(lambda mod, args, out: out + vector.to(out.dtype))
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def _captured(model, layer: int, store: list) -> Iterator[None]:
    """Record the residual stream at `layer` (as residual_added adds to it) of every forward pass."""
    layer = _check_layer(model, layer)
    blocks = model.net.layers
    if layer == 0:
        handle = blocks[0].register_forward_pre_hook(lambda mod, args: store.append(args[0].detach()))
    else:
        handle = blocks[layer - 1].register_forward_hook(lambda mod, args, out: store.append(out.detach()))
    try:
        yield
    finally:
        handle.remove()


def word_token_ids(tok, corpus, concept: str) -> list[int]:
    """The token ids that begin the concept's words as they stand in the text (after a space):
    the first token of " word" for each word of its lexicon; the pattern concept: of " 1" … " 99"."""
    words = ([str(i) for i in range(1, 100)] if concept == corpus.config.pattern_name else corpus.lexicon[concept])
    ids = set()
    for w in words:
        enc = tok.encode(" " + w, add_special_tokens=False)
        if enc:
            ids.add(int(enc[0]))
    return sorted(ids)


@torch.no_grad()
def mean_difference(model, batches, has_concept: Callable[[Any], torch.Tensor], layer: int) -> torch.Tensor:
    """(e,): mean residual stream at `layer` over the tokens of chunks carrying the concept minus the
    mean over the tokens of the other chunks. batches: LMBatch-es; has_concept(batch) (c,) bool per
    chunk of the batch (its local order)."""
    from penrose_zoo.steerling.attribution import forward_ids

    e = model.sizes["e"]
    sums, counts = torch.zeros(2, e, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    for batch in batches:
        store: list = []
        with _captured(model, layer, store):
            forward_ids(model, batch.input_ids)
        h = store[-1].double().reshape(-1, e)
        idx = batch.chunk_index.reshape(-1)
        ok = idx >= 0
        on = torch.zeros_like(ok)
        on[ok] = has_concept(batch).to(torch.bool)[idx[ok]]
        for k, sel in ((0, ok & on), (1, ok & ~on)):
            sums[k] += h[sel].sum(0)
            counts[k] += sel.sum()
    if (counts == 0).any():
        raise ValueError("mean_difference: no token of a chunk with (or without) the concept in the batches")
    return (sums[0] / counts[0] - sums[1] / counts[1]).float()


@dataclasses.dataclass(frozen=True)
class Edit:
    """One steering edit at a strength: kind 'weight' (the model's: concept's post-top-k weight set to
    strength, ε held), 'logit_bias' (+strength on `tokens`' logits), 'residual' (strength · vector
    added at `layer`: activation addition or layer injection)."""

    kind: str
    strength: float
    concept: int | None = None
    tokens: tuple[int, ...] = ()
    vector: torch.Tensor | None = None
    layer: int = 0

    def at(self, strength: float) -> "Edit":
        return dataclasses.replace(self, strength=float(strength))

    def bias(self, vocab: int) -> torch.Tensor | None:
        """The logit bias (v,) of a 'logit_bias' edit (None otherwise)."""
        if self.kind != "logit_bias":
            return None
        b = torch.zeros(vocab)
        b[list(self.tokens)] = self.strength
        return b

    def residual(self) -> tuple[int, torch.Tensor] | None:
        return (self.layer, self.strength * self.vector) if self.kind == "residual" and self.vector is not None else None


@torch.no_grad()
def edit_logits(model, input_ids: torch.Tensor, edit: Edit, plain=None) -> torch.Tensor:
    """The logits (b, t, v) of the model's forward pass on input_ids under the edit."""
    from penrose_zoo.steerling.attribution import forward_ids
    from penrose_zoo.steerling.steer import edit_keeping_epsilon

    if edit.kind == "weight":
        plain = forward_ids(model, input_ids) if plain is None else plain
        if edit.concept is None:
            raise ValueError("a 'weight' edit names its concept")
        return edit_keeping_epsilon(model, plain, {int(edit.concept): edit.strength}).logits.float()
    if edit.kind == "logit_bias":
        plain = forward_ids(model, input_ids) if plain is None else plain
        bias = edit.bias(plain.logits.shape[-1])
        assert bias is not None
        return plain.logits.float() + bias.to(plain.logits.device)
    residual = edit.residual()
    if residual is not None:
        with residual_added(model, *residual):
            return forward_ids(model, input_ids).logits.float()
    raise ValueError(f"unknown edit kind {edit.kind!r}")


@torch.no_grad()
def edit_kl(model, batches, edit: Edit) -> float:
    """Mean KL(p_edit ‖ p) of the next-token distributions over the valid positions of `batches`
    (LMBatch-es), in nats: the fluency cost of the edit."""
    from penrose_zoo.steerling.attribution import forward_ids

    total, count = 0.0, 0
    for batch in batches:
        plain = forward_ids(model, batch.input_ids)
        lp = torch.log_softmax(plain.logits.float(), -1)
        lq = torch.log_softmax(edit_logits(model, batch.input_ids, edit, plain), -1)
        kl = (lq.exp() * (lq - lp)).sum(-1)
        valid = batch.valid
        total += float(kl[valid].sum())
        count += int(valid.sum())
    return total / max(count, 1)


def match_strength(kl_of: Callable[[float], float], target: float, *, start: float = 1.0, rel_tol: float = 0.02,
                   max_iter: int = 40) -> tuple[float, float]:
    """(strength, kl) with kl_of(strength) within rel_tol of target, by doubling an upper bound from
    `start` then bisecting on [0, bound] (kl_of(0) = 0, increasing in the strength). Returns the
    closest found when max_iter runs out."""
    if not math.isfinite(target) or target < 0:
        raise ValueError(f"target KL must be a finite number >= 0, got {target!r}")
    if target == 0:
        return 0.0, 0.0
    lo, hi = 0.0, float(start)
    k_hi = kl_of(hi)
    best = (hi, k_hi)
    it = 0
    while k_hi < target and it < max_iter:
        lo, hi = hi, hi * 2
        k_hi = kl_of(hi)
        best = min(best, (hi, k_hi), key=lambda p: abs(p[1] - target))
        it += 1
    while abs(best[1] - target) > rel_tol * target and it < max_iter:
        mid = (lo + hi) / 2
        k = kl_of(mid)
        best = min(best, (mid, k), key=lambda p: abs(p[1] - target))
        lo, hi = (mid, hi) if k < target else (lo, mid)
        it += 1
    return best


def specificity(rates_steered: dict[str, list[dict[str, float]]], rates_base: list[dict[str, float]],
                names: list[str]) -> dict[str, dict[str, float | None]]:
    """matrix[c][d]: mean rate of d's words when c is steered / mean rate without (None where d never
    appears unsteered). rates_*: per generation, {concept: rate} (text_concept_rates)."""
    out: dict[str, dict[str, float | None]] = {}
    for c, gens in rates_steered.items():
        row: dict[str, float | None] = {}
        for d in names:
            base = float(np.mean([r[d] for r in rates_base])) if rates_base else 0.0
            row[d] = float(np.mean([r[d] for r in gens])) / base if base > 0 else None
        out[c] = row
    return out


def detector_precision(scores: np.ndarray, labels: np.ndarray) -> dict:
    """Attribution by the detector alone: per chunk with a label, is the concept of the largest chunk
    presence score (scores (c, n)) one of its labels (labels (c, n) 0/1)? precision and chunks."""
    keep = labels.sum(1) > 0
    if not keep.any():
        return {"precision": None, "chunks": 0}
    top = scores[keep].argmax(1)
    return {"precision": float(labels[keep][np.arange(int(keep.sum())), top].mean()), "chunks": int(keep.sum())}


def aggregate(values, *, n_boot: int = 2000, seed: int = 0) -> dict:
    """Statistics of one figure over training seeds (None entries dropped): mean, sd (ddof 1), min,
    max, n, and a 95% bootstrap interval of the mean over seeds (percentile; with n = 1 the value)."""
    xs = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if xs.size == 0:
        return {"mean": None, "sd": None, "min": None, "max": None, "n": 0, "ci95": None, "values": []}
    rng = np.random.default_rng(seed)
    boots = xs[rng.integers(0, xs.size, size=(n_boot, xs.size))].mean(1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"mean": float(xs.mean()), "sd": float(xs.std(ddof=1)) if xs.size > 1 else 0.0, "min": float(xs.min()),
            "max": float(xs.max()), "n": int(xs.size), "ci95": [float(lo), float(hi)], "values": xs.tolist()}


# -- the seeds runner: `penrose steerling nulls` ------------------------------------------------------

def _summary(r: dict, key: str):
    return r["summary"].get(key)


def _raised(r: dict, method: str = "model") -> int | None:
    """Concepts whose injection (or a baseline's) raises their words with the 95% interval above 1."""
    if not r["steering"] or (method != "model" and not any(st.get("baselines") for st in r["steering"].values())):
        return None
    n = 0
    for st in r["steering"].values():
        inj = st["inject"] if method == "model" else ((st.get("baselines") or {}).get(method) or {}).get("inject")
        n += bool(inj and inj["ratio_ci95"] and inj["ratio_ci95"][0] > 1)
    return n


def _lowered(r: dict) -> int | None:
    sup = [st["suppress"] for st in r["steering"].values() if st.get("suppress")]
    return sum(bool(s["ratio_ci95"] and s["ratio_ci95"][1] < 1) for s in sup) if sup else None


def _own_over_others(r: dict, method: str = "model") -> float | None:
    """Median over steered concepts of (ratio on its own words) / (mean ratio on the other concepts' words)."""
    mat = (r.get("specificity") or {}).get(method)
    if not mat:
        return None
    vals = []
    for c, row in mat.items():
        others = [v for d, v in row.items() if d != c and v is not None]
        if row.get(c) is not None and others and np.mean(others) > 0:
            vals.append(row[c] / float(np.mean(others)))
    return float(np.median(vals)) if vals else None


def _baseline(r: dict, b: str, key: str):
    return (r["summary"].get("baselines") or {}).get(b, {}).get(key)


def _median_kl(r: dict, b: str | None = None) -> float | None:
    kls = [st["kl"] if b is None else st["baselines"][b]["kl"] for st in r["steering"].values()
           if "kl" in st and (b is None or st["baselines"].get(b))]
    return float(np.median(kls)) if kls else None


#: (figure, function of one known_answer result) — the rows of the claim-vs-null table
FIGURES: list[tuple[str, Callable[[dict], Any]]] = [
    ("val loss", lambda r: r["val_loss"]),
    ("detection AUC, module", lambda r: _summary(r, "detection_auc_mean")),
    ("detection AUC, linear probe on h", lambda r: _summary(r, "probe_auc_mean")),
    ("known share of the logits", lambda r: _summary(r, "known_logit_share")),
    ("held-out attribution precision", lambda r: _summary(r, "heldout_attribution_precision")),
    ("  chance", lambda r: r["attribution"]["heldout_chance"]),
    ("  detector-only precision", lambda r: _summary(r, "detector_attribution_precision")),
    ("withheld: best unknown AUC", lambda r: _summary(r, "unknown_recovery_auc")),
    ("inject: median ratio", lambda r: _summary(r, "inject_ratio_median")),
    ("inject: concepts raised (CI > 1)", _raised),
    ("inject: median KL (nats)", _median_kl),
    ("inject: own / others' words", _own_over_others),
    ("clamp: median ratio", lambda r: _summary(r, "suppress_ratio_median")),
    ("clamp: concepts lowered (CI < 1)", _lowered),
    *[(f"{b}: median ratio", lambda r, b=b: _baseline(r, b, "inject_ratio_median")) for b in BASELINES],
    *[(f"{b}: concepts raised", lambda r, b=b: _raised(r, b)) for b in BASELINES],
    *[(f"{b}: own / others' words", lambda r, b=b: _own_over_others(r, b)) for b in BASELINES],
    *[(f"model beats {b} (concepts)", lambda r, b=b: _baseline(r, b, "model_beats")) for b in BASELINES],
]

MODELS = ("model", *TRAINED_NULLS, *NULLS)


def _value(fn, r):
    try:
        v = fn(r)
    except (KeyError, TypeError):
        return None
    return None if v is None else float(v)


def nulls_table(runs: dict[str, list[dict]]) -> dict[str, dict[str, dict]]:
    """{figure: {model or null: aggregate over its seeds}} of known_answer results per seed."""
    return {name: {m: aggregate([_value(fn, r) for r in rs]) for m, rs in runs.items()} for name, fn in FIGURES}


def format_nulls(table: dict[str, dict[str, dict]], order=MODELS) -> str:
    """The claim-vs-null table: mean [95% bootstrap interval over seeds] per cell; '—' not measured."""
    cols = [m for m in order if any(m in row for row in table.values())]
    head = f"{'figure':<44}" + "".join(f"{c:>26}" for c in cols)
    lines = [head, "-" * len(head)]
    for name, row in table.items():
        cells = []
        for c in cols:
            a = row.get(c)
            if not a or a["mean"] is None:
                cells.append(f"{'—':>26}")
                continue
            ci = a["ci95"]
            cells.append(f"{a['mean']:>9.3f} [{ci[0]:.3f}, {ci[1]:.3f}]".rjust(26))
        if any(cell.strip() != "—" for cell in cells):
            lines.append(f"{name:<44}" + "".join(cells))
    return "\n".join(lines)

