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

Over corpora (`penrose steerling nulls-table`, `combine_runs`): each `nulls` run is one corpus
draw; a figure's per-corpus value is its mean over that corpus's k training seeds, and the stated
interval is the 95% prediction interval for one more corpus's k-seed mean (`corpus_interval`):
m ± t_{0.975, n−1} · √(V̂ (1 + 1/n)) over the n corpora's means, V̂ the larger of their variance and
the seeds' pooled within-corpus variance / k (random effects, the corpus part truncated at 0);
counts of concepts widened to the beta-binomial posterior predictive; beside it the simultaneous
(Bonferroni) interval for every figure judged at once. `prediction_interval` is the textbook
interval over the means alone. Figures that are properties of the corpus, not claims (the
attribution chance level), get no interval: they are shown per corpus, and the claims against them
as differences (precision − chance).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import random
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

__all__ = ["NULLS", "TRAINED_NULLS", "BASELINES", "Edit", "shuffle_labels", "shuffle_known_embeddings",
           "reinitialised", "residual_added", "word_token_ids", "mean_difference", "edit_logits", "edit_kl",
           "match_strength", "specificity", "mean_specificity", "aggregate", "detector_precision", "t_quantile",
           "prediction_interval", "corpus_interval", "load_run", "combine_runs", "format_combined", "CORPUS_PROPERTIES"]

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


def mean_specificity(results: list[dict], method: str = "model") -> dict[str, dict[str, float | None]] | None:
    """The specificity matrix (inject row c: the rate ratio of each concept d's words) averaged over
    known_answer `results` (seeds, corpora): per cell the mean of the runs that have it (None where
    none does); None when no run has the method's matrix."""
    mats = [m for r in results if (m := (r.get("specificity") or {}).get(method))]
    if not mats:
        return None
    rows = list(dict.fromkeys(c for m in mats for c in m))
    cols = list(dict.fromkeys(d for m in mats for row in m.values() for d in row))
    out: dict[str, dict[str, float | None]] = {}
    for c in rows:
        out[c] = {}
        for d in cols:
            vals = [m[c][d] for m in mats if c in m and m[c].get(d) is not None]
            out[c][d] = float(np.mean(vals)) if vals else None
    return out


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
    ("  precision − chance", lambda r: _summary(r, "heldout_attribution_precision") - r["attribution"]["heldout_chance"]),
    ("  detector-only − chance",
     lambda r: _summary(r, "detector_attribution_precision") - r["attribution"]["heldout_chance"]),
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
    rows = [["figure", *cols]]
    for name, row in table.items():
        cells = [_seed_cell(row.get(c)) for c in cols]
        if any(cell != "—" for cell in cells):
            rows.append([name, *cells])
    return "\n".join(_render(rows, False, width=26))


# -- over corpora: prediction intervals for a re-run (`penrose steerling nulls-table`) ---------------

#: figures that are properties of the corpus draw, not claims: shown per corpus, no interval
CORPUS_PROPERTIES = ("  chance",)


@functools.lru_cache(maxsize=None)
def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with df degrees of freedom (0.5 < p < 1): bisection on the CDF,
    0.5 + the integral of the density from 0 (composite Simpson's rule on 4,000 intervals, the density's
    constant from lgamma); within 1e-6 relative for p <= 0.9995, 1e-9 for 0.975."""
    if not 0.5 < p < 1:
        raise ValueError(f"t_quantile: p must be in (0.5, 1), got {p!r}")
    if df < 1 or int(df) != df:
        raise ValueError(f"t_quantile: df must be a whole number >= 1, got {df!r}")
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(t: float) -> float:
        xs = np.linspace(0.0, t, 4001)
        f = c * (1 + xs * xs / df) ** (-(df + 1) / 2)
        h = t / 4000
        return 0.5 + h / 3 * float(f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def prediction_interval(values, *, level: float = 0.95, bounds: tuple[float, float] = (-math.inf, math.inf)) -> dict:
    """The normal-theory prediction interval for one more draw from the population of `values` (None
    dropped): mean ± t_{(1+level)/2, n−1} · sd · √(1 + 1/n), sd with ddof 1, clipped to `bounds` (the
    figure's possible range; clipping removes no possible outcome). n < 2: no interval ("pi" None)."""
    if not 0 < level < 1:
        raise ValueError(f"prediction_interval: level must be in (0, 1), got {level!r}")
    xs = np.asarray([v for v in values if v is not None], dtype=np.float64)
    out: dict = {"mean": float(xs.mean()) if xs.size else None, "sd": float(xs.std(ddof=1)) if xs.size > 1 else None,
                 "n": int(xs.size), "pi": None, "values": xs.tolist()}
    if xs.size >= 2:
        half = t_quantile((1 + level) / 2, int(xs.size) - 1) * out["sd"] * math.sqrt(1 + 1 / xs.size)
        out["pi"] = [max(out["mean"] - half, bounds[0]), min(out["mean"] + half, bounds[1])]
    return out


def _beta_binomial_interval(successes: float, trials: float, m: int, level: float) -> tuple[int, int]:
    """The central `level` interval of the number of successes in m new trials when `successes` of
    `trials` were seen: the beta-binomial posterior predictive under Jeffreys' prior Beta(½, ½)
    (pmf from lgamma; the lower end the smallest t with P(T ≤ t) > α/2, the upper the smallest with
    P(T ≤ t) ≥ 1 − α/2)."""
    a, b = successes + 0.5, trials - successes + 0.5
    lbeta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    pmf = [math.exp(math.lgamma(m + 1) - math.lgamma(t + 1) - math.lgamma(m - t + 1)
                    + math.lgamma(t + a) + math.lgamma(m - t + b) - math.lgamma(m + a + b) - lbeta)
           for t in range(m + 1)]
    cdf = np.cumsum(pmf) / sum(pmf)
    alpha = 1 - level
    lo = int(np.argmax(cdf > alpha / 2))
    hi = int(np.argmax(cdf >= 1 - alpha / 2 - 1e-12))
    return lo, hi


def corpus_interval(groups, *, level: float = 0.95, bounds: tuple[float, float] = (-math.inf, math.inf),
                    trials: int | None = None) -> dict:
    """The prediction interval for a new corpus's k-seed mean from the seed values of n corpora
    (`groups`: one list per corpus, None dropped; k = the seeds of the corpora, the most common count).

    A corpus's k-seed mean varies as V = σ²_corpus + σ²_seed / k. `prediction_interval` estimates V by
    the spread s² of the n corpus means alone (n − 1 degrees of freedom); here V is estimated as
    max(s², MSW / k), MSW the seeds' pooled variance within corpora — the one-way random-effects
    estimate with the corpus component truncated at 0: the corpus means cannot truly vary less than
    their own seed noise allows, and when they happen to agree more closely (s² < MSW / k) the
    textbook interval is too narrow exactly then (conditional coverage 54–80% in simulation). The
    interval: m ± t_{(1+level)/2, n−1} · √(V̂ (1 + 1/n)), m the mean of the corpus means; n − 1
    degrees of freedom kept either way (conservative: coverage ≥ nominal in simulation at every
    ratio of the two variances, exact when the corpora dominate).

    Counts (`trials`: concepts per seed, each seed's value the number of successes): a normal interval
    says nothing about a count that sat at its ceiling on every seed, so the interval is widened to
    cover the beta-binomial posterior predictive of the new k seeds' total (Jeffreys' prior, every
    seed's trials pooled; `_beta_binomial_interval`) divided by k. Clipped to `bounds`."""
    if not 0 < level < 1:
        raise ValueError(f"corpus_interval: level must be in (0, 1), got {level!r}")
    gs = [np.asarray([v for v in g if v is not None], dtype=np.float64) for g in groups]
    gs = [g for g in gs if g.size]
    out = prediction_interval([float(g.mean()) for g in gs], level=level, bounds=bounds)
    sizes = [int(g.size) for g in gs]
    k = max(set(sizes), key=sizes.count) if sizes else 0
    dfw = sum(s - 1 for s in sizes)
    msw = float(sum(((g - g.mean()) ** 2).sum() for g in gs) / dfw) if dfw else None
    out.update({"seeds": k, "sd_within": None if msw is None else math.sqrt(msw), "basis": "corpora"})
    if out["pi"] is None:
        return out
    n, m = out["n"], out["mean"]
    var = out["sd"] ** 2
    if msw is not None and msw / k > var:
        var, out["basis"] = msw / k, "seeds"
    half = t_quantile((1 + level) / 2, n - 1) * math.sqrt(var * (1 + 1 / n))
    lo, hi = m - half, m + half
    if trials is not None:
        seen = float(sum(g.sum() for g in gs))
        blo, bhi = _beta_binomial_interval(seen, trials * sum(sizes), k * trials, level)
        if blo / k < lo or bhi / k > hi:
            out["basis"] += "+binomial"
        lo, hi = min(lo, blo / k), max(hi, bhi / k)
    out["sd_used"] = math.sqrt(var)
    out["pi"] = [max(lo, bounds[0]), min(hi, bounds[1])]
    return out


def _is_count(figure: str) -> bool:
    return "(concepts)" in figure or "concepts raised" in figure or "concepts lowered" in figure


def _bounds_of(figure: str, concepts: int | None = None) -> tuple[float, float]:
    """A figure's possible range; counts of concepts are at most the steered concepts' number."""
    if _is_count(figure):
        return (0.0, math.inf if concepts is None else float(concepts))
    if "− chance" in figure:
        return (-1.0, 1.0)
    if any(w in figure for w in ("AUC", "precision", "share")):
        return (0.0, 1.0)
    return (0.0, math.inf)  # losses, ratios, counts, KL


def _error(message: str):
    from penrose.errors import PenroseError

    return PenroseError(message)


def load_run(path: str | Path) -> dict:
    """A `penrose steerling nulls` result: OUT/nulls.json (or the file itself), checked to hold a model
    run; "path" and "corpus" (the planted corpus's draw: its .planted.json config, else its path) added."""
    import json

    p = Path(path)
    f = p / "nulls.json" if p.is_dir() else p
    if not f.is_file():
        raise _error(f"{path}: no nulls.json (the --out folder of `penrose steerling nulls`, or its nulls.json)")
    try:
        doc = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise _error(f"{f}: unreadable ({e})") from None
    except json.JSONDecodeError as e:
        raise _error(f"{f}:{e.lineno}:{e.colno}: not JSON ({e.msg})") from None
    if (not isinstance(doc, dict) or not isinstance(doc.get("config"), dict) or not isinstance(doc.get("runs"), dict)
            or not isinstance(doc["runs"].get("model"), list) or not doc["runs"]["model"]):
        raise _error(f"{f}: not a `penrose steerling nulls` result (no config, or no model runs)")
    data = Path(str(doc["config"].get("data", "")))
    planted = data / ".planted.json"
    corpus: Any = str(data.resolve())
    if planted.is_file():
        try:
            corpus = json.loads(planted.read_text()).get("config", corpus)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            pass
    return {**doc, "path": str(path), "corpus": corpus}


#: the config keys that may differ between the runs combined (everything else must match)
_FREE = ("data", "seeds", "nulls", "baselines")


def _check_same_settings(runs: list[dict]) -> None:
    first = runs[0]
    for r in runs[1:]:
        for key in sorted(set(first["config"]) | set(r["config"])):
            if key not in _FREE and first["config"].get(key) != r["config"].get(key):
                raise _error(f"{r['path']}: {key} is {r['config'].get(key)!r}, {first['path']} has "
                             f"{first['config'].get(key)!r}; the runs combined must differ only in corpus and seeds")
        if len(r["runs"]["model"]) != len(first["runs"]["model"]):
            raise _error(f"{r['path']}: {len(r['runs']['model'])} training seeds, {first['path']} has "
                         f"{len(first['runs']['model'])}; the interval is for a mean over one number of seeds")


def _corpus_label(run: dict) -> str:
    c = run["corpus"]
    return f"s{c.get('seed')}/{c.get('n_chunks')}" if isinstance(c, dict) else Path(str(c)).name


def _inside(pi, value) -> bool | None:
    if pi is None or value is None:
        return None
    return bool(pi[0] - 1e-12 <= value <= pi[1] + 1e-12)


def _run_info(r: dict) -> dict:
    return {"path": r["path"], "data": r["config"].get("data"), "corpus": _corpus_label(r),
            "seeds": r["config"].get("seeds")}


def combine_runs(runs: list[dict], rerun: dict | list[dict] | None = None, *, level: float = 0.95) -> dict:
    """Figures over corpora: `runs` are `load_run` results, one per corpus draw (at least 2, the same
    settings and number of seeds, no corpus twice); the first one's nulls are reported beside its model
    (mean and bootstrap interval over its seeds, as `nulls` prints them). Per figure: each corpus's
    seed mean and seed values, the `corpus_interval` over them at `level` ("prediction") and at the
    simultaneous level 1 − (1 − level) / J for the J figures judged ("simultaneous": Bonferroni, so
    that a re-run lands every figure inside them with probability ≥ `level`); none for
    CORPUS_PROPERTIES. `rerun`: one or more independent runs (other corpora, the same settings and
    number of seeds), each judged against both: its seed mean per figure, inside or not."""
    if len(runs) < 2:
        raise _error("a prediction interval over corpora needs at least 2 runs (one per corpus draw)")
    reruns = [] if rerun is None else [rerun] if isinstance(rerun, dict) else list(rerun)
    every = [*runs, *reruns]
    _check_same_settings(every)
    for i, a in enumerate(every):
        for b in every[:i]:
            if a["corpus"] == b["corpus"]:
                what = "the re-run's corpus is" if i >= len(runs) else "the same corpus is"
                raise _error(f"{a['path']} and {b['path']}: {what} used twice ({_corpus_label(a)}); "
                             "each run must be its own corpus draw")
    first = nulls_table(runs[0]["runs"])
    steered = {len(r.get("steering") or {}) for run in runs for r in run["runs"]["model"]}
    concepts = max(steered) if steered and max(steered) > 0 else None
    per = [nulls_table({"model": r["runs"]["model"]}) for r in runs]
    again = [nulls_table({"model": r["runs"]["model"]}) for r in reruns]

    def interval(name: str, lev: float):
        return corpus_interval([t[name]["model"]["values"] for t in per], level=lev, bounds=_bounds_of(name, concepts),
                               trials=concepts if _is_count(name) else None)

    preds = {name: None if name in CORPUS_PROPERTIES else interval(name, level) for name, _ in FIGURES}
    judged_names = [name for name, p in preds.items() if p is not None and p["pi"] is not None]
    family = 1 - (1 - level) / max(1, len(judged_names))
    rows: dict[str, dict] = {}
    for name, _ in FIGURES:
        prop = name in CORPUS_PROPERTIES
        pred = preds[name]
        sim = interval(name, family) if name in judged_names else None
        values = [t[name]["model"]["mean"] for t in again]
        rows[name] = {"first": first[name], "per_corpus": [t[name]["model"]["mean"] for t in per],
                      "seed_values": [t[name]["model"]["values"] for t in per], "corpus_property": prop,
                      "prediction": pred, "simultaneous": sim,
                      "reruns": [{"value": v, "inside": _inside(pred and pred["pi"], v),
                                  "inside_simultaneous": _inside(sim and sim["pi"], v)} for v in values]}
    judged = []
    for i, r in enumerate(reruns):
        cells = {n: row["reruns"][i] for n, row in rows.items() if row["reruns"][i]["inside"] is not None}

        def count(key):
            return {"n": sum(bool(c[key]) for c in cells.values()), "of": len(cells),
                    "outside": [n.strip() for n, c in cells.items() if not c[key]]}
        judged.append({**_run_info(r), "inside": count("inside"), "inside_simultaneous": count("inside_simultaneous")})
    every_seed = [x for r in runs for x in r["runs"]["model"]]
    spec = {m: mat for m in ("model", *BASELINES) if (mat := mean_specificity(every_seed, m)) is not None}
    return {"level": level, "simultaneous_level": family, "seeds_per_corpus": len(runs[0]["runs"]["model"]),
            "corpora": [_run_info(r) for r in runs], "reruns": judged, "rows": rows,
            "specificity": {"seeds": len(every_seed), "matrices": spec}}


def _cell(v, ci=None) -> str:
    if v is None:
        return "—"
    return f"{v:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def _seed_cell(a: dict | None) -> str:
    """An `aggregate` over seeds as a cell: mean [bootstrap interval]; '—' not measured."""
    return _cell(a["mean"], a["ci95"]) if a and a["mean"] is not None else "—"


def _render(rows: list[list[str]], markdown: bool, first: int = 44, width: int = 12) -> list[str]:
    """A header row and body rows as fixed-width text (figure column left, the others right) or markdown."""
    if markdown:
        out = ["| " + " | ".join(x.strip() for x in rows[0]) + " |", "| " + " | ".join("---" for _ in rows[0]) + " |"]
        return out + ["| " + " | ".join(x.strip() for x in r) + " |" for r in rows[1:]]
    ws = [max(width, *(len(r[j]) + 2 for r in rows)) for j in range(1, len(rows[0]))]
    text = [f"{r[0]:<{first}}" + "".join(f"{x:>{w}}" for x, w in zip(r[1:], ws)) for r in rows]
    return [text[0], "-" * len(text[0]), *text[1:]]


def format_combined(c: dict, *, markdown: bool = False) -> str:
    """Two tables: the figures per corpus (seed means, then each re-run's), then the first corpus's model
    and nulls (mean [bootstrap interval over seeds]) beside the prediction interval over corpora, the
    simultaneous one and each re-run (inside: "yes" inside both, "simult." only inside the simultaneous
    one, "NO" outside both); fixed-width text, or markdown."""
    k = c["seeds_per_corpus"]
    reruns = c["reruns"]
    names = [x["corpus"] for x in c["corpora"]] + ["re-run " + r["corpus"] for r in reruns]
    per = [["figure", *names]]
    for name, r in c["rows"].items():
        vals = [*r["per_corpus"], *(x["value"] for x in r["reruns"])]
        if any(v is not None for v in vals):
            per.append([name, *(_cell(v) for v in vals)])
    cols = [m for m in MODELS if any(m in r["first"] for r in c["rows"].values())]
    pct = f"{100 * c['level']:g}%"
    head = ["figure", *(f"{m} {c['corpora'][0]['corpus']} ({k})" for m in cols),
            f"{len(c['corpora'])} corpora: {pct} PI", f"all figures: {pct} simultaneous",
            *(x for r in reruns for x in (f"re-run {r['corpus']}", "inside"))]
    main = [head]
    for name, r in c["rows"].items():
        cells = [_seed_cell(r["first"].get(m)) for m in cols]
        p, q = r["prediction"], r["simultaneous"]
        pi = "corpus property" if r["corpus_property"] else (_cell(p["mean"], p["pi"]) if p and p["mean"] is not None
                                                             else "—")
        sim = "—" if not q or q["pi"] is None else f"[{q['pi'][0]:.3f}, {q['pi'][1]:.3f}]"
        tail = []
        for x in r["reruns"]:
            verdict = ("—" if x["inside"] is None else "yes" if x["inside"] else
                       "simult." if x["inside_simultaneous"] else "NO")
            tail += [_cell(x["value"]), verdict]
        if any(x != "—" for x in cells) or pi != "—":
            main.append([name, *cells, pi, sim, *tail])
    lines = [f"per corpus (mean over {k} training seeds)", *_render(per, markdown), "", *_render(main, markdown, width=10)]
    spec = c.get("specificity") or {}
    for m, mat in (spec.get("matrices") or {}).items():
        cols = list(next(iter(mat.values())))
        lines += ["", f"specificity ({m}), mean over the {len(c['corpora'])} corpora's {spec['seeds']} seeds: rows "
                      "injected, columns the rate ratio of each concept's words",
                  *_render([["injected", *cols], *([x, *(_cell(row[d]) for d in cols)] for x, row in mat.items())],
                           markdown, first=12, width=8)]
    for r in reruns:
        a, b = r["inside"], r["inside_simultaneous"]
        lines.append(f"\nre-run {r['corpus']}: inside the {pct} prediction intervals {a['n']} of {a['of']} figures"
                     + (f" (outside: {', '.join(a['outside'])})" if a["outside"] else "")
                     + f"; inside the simultaneous {pct} intervals {b['n']} of {b['of']}"
                     + (f" (outside: {', '.join(b['outside'])})" if b["outside"] else ""))
    return "\n".join(lines)
