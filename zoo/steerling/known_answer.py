"""Known-answer measurements of a Steerling checkpoint trained on a planted-concept corpus
(penrose_zoo.steerling.planted): `penrose steerling known-answer --checkpoint RUN`.

Index legend: b batch, t position, v vocabulary, e embedding, n known concept, m unknown concept,
c chunk.

The checkpoint's training corpus (train.json's --data) must hold a planted corpus
(DIR/.planted.json): its truth gives every chunk's planted concepts, withheld ones included, and
the lexicon of each concept. Measured on the same packed validation rows training validated on
(`train.packed`), chunk pieces counted per piece as in penrose_zoo.steerling.measure:

  detection        per labelled concept, ROC-AUC on validation chunks of the concept module's
                   chunk presence (ranked by −log(1 − P) = −Σ_t logσ(−z_t), the same order as P
                   without its float saturation at 1) against the planted labels; beside it a
                   linear probe (standardised logistic regression, C = 1) on the same hidden
                   states h pooled per chunk (mean and max over the chunk's tokens,
                   concatenated), fit on training chunks: the best a linear read-out of h does.
                   Also the token-level AUC of σ(z_t) against the planted spans.
  logit share      measure.logit_share on validation rows: (|K| + |U|) / (|K| + |U| + |ε|) and
                   |K| / (...) of each argmax logit (K, U, ε the known, unknown, ε parts), over
                   every position, and |K| / (...) over the positions where some known concept's
                   weight is above 0.5 (with the fraction of positions that are such).
  steering         per labelled concept c, `samples` seeded generations of `new_tokens` tokens
                   (temperature 1, top-p 1), one forward pass per token, stopped at <|eoc|>:
                   injection: from neutral prompts (a filler sentence), with c's post-top-k
                     weight set to `strength` at every position against the same seeds without
                     intervention — ε held (steer.edit_keeping_epsilon: k̂ += Δw K_c, the logits
                     move by Δw K_c Wᵀ), or with epsilon_off the release's intervene_known, which
                     switches ε off and hands the logits to k̂ + û alone, against a null edit
                     (the same switch, no weight changed); the rate is
                     the fraction of generated words in c's lexicon (numbers for the pattern
                     concept);
                   suppression: from prompts that express c (one of its sentences from a
                     validation chunk), c's weight set to 0 against no intervention (the post's
                     clamp); unlearning: the same plus the release's relu logit mask
                     (SteeringConfig.injection_relu's: strength · relu(W K_c) subtracted from the
                     sampling logits, strength `unlearn_strength`);
                   ratio = mean rate with / without, with a 95% bootstrap interval over samples
                   (paired by seed); fluency = the mean negative log-likelihood of the generated
                   tokens under the unsteered model (read in the same forward passes).
  attribution      exact concept→logit attribution (penrose_zoo.steerling.attribution):
                   held-out: per validation chunk the known concept with the largest summed
                     contribution to the logits of the chunk's own next tokens; precision = the
                     fraction of chunks where it is one of the chunk's planted labels (chance:
                     the mean share of labels among the known concepts);
                   generated: the same over the tokens of each generation (unsteered and
                     injected), recorded in the pass that sampled each token, against the
                     labelled concepts whose words the generation contains; `verify()` of the
                     GenerationAttribution (contributions sum to the sampled logits).
  unknown recovery per withheld concept, the unknown concept whose chunk presence (from the
                   unknown head's pre-top-k logits) has the best AUC on training chunks, and its
                   AUC on validation chunks; beside it the linear probe on h.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

__all__ = ["known_answer", "format_report", "chunk_pool", "probe_aucs", "bootstrap_ratio", "sample_steered"]


def _auc(score, label) -> float | None:
    """ROC-AUC of one score column against 0/1 labels (penrose_zoo.metrics), None without both classes."""
    from penrose_zoo.metrics import concept_aucs

    a = concept_aucs(np.asarray(score, dtype=np.float64)[:, None], np.asarray(label)[:, None])[0]
    return None if np.isnan(a) else float(a)


@torch.no_grad()
def chunk_pool(model, batches, truth_labels) -> dict:
    """Per chunk piece over LMBatch-es: known and unknown chunk scores −log(1 − P) (c, n), (c, m);
    h pooled (c, 2e) as [mean, max]; planted labels (c, N) from truth_labels(batch) (the batch's
    chunks, in its local order); token-level known probabilities and planted token labels."""
    from penrose_zoo.steerling.attribution import forward_ids
    from penrose_zoo.steerling.losses import chunk_log_absence

    ks, us, hs, ys, tok_p, tok_y = [], [], [], [], [], []
    for batch, token_labels in batches:
        out = forward_ids(model, batch.input_ids)
        c = batch.chunk_labels.shape[0]
        idx = batch.chunk_index
        ks.append(-chunk_log_absence(out.known_logits, idx, c))
        us.append(-chunk_log_absence(out.unknown_logits, idx, c))
        valid = (idx >= 0).reshape(-1)
        h = out.hidden.float().reshape(-1, out.hidden.shape[-1])[valid]
        flat = idx.reshape(-1)[valid]
        count = torch.zeros(c).index_add(0, flat, torch.ones(flat.shape[0])).clamp_min(1).unsqueeze(-1)
        mean = torch.zeros(c, h.shape[-1]).index_add(0, flat, h) / count
        mx = torch.full((c, h.shape[-1]), -math.inf).scatter_reduce(0, flat[:, None].expand_as(h), h, "amax")
        hs.append(torch.cat([mean, mx], -1))
        ys.append(truth_labels(batch))
        if token_labels is not None:
            n = out.known_logits.shape[-1]
            tok_p.append(torch.sigmoid(out.known_logits.float()).reshape(-1, n)[valid])
            tok_y.append(token_labels.reshape(-1, token_labels.shape[-1])[valid])
    res = {"known": torch.cat(ks).numpy(), "unknown": torch.cat(us).numpy(), "h": torch.cat(hs).numpy(),
           "labels": torch.cat(ys).numpy()}
    if tok_p:
        res["token_prob"], res["token_labels"] = torch.cat(tok_p).numpy(), torch.cat(tok_y).numpy()
    return res


def probe_aucs(x_tr, y_tr, x_va, y_va, C: float = 1.0) -> list[float | None]:
    """Per column of y, validation AUC of a standardised logistic-regression probe fit on training."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    out: list[float | None] = []
    for j in range(y_tr.shape[1]):
        ytr, yva = y_tr[:, j] > 0.5, y_va[:, j] > 0.5
        if ytr.all() or not ytr.any() or yva.all() or not yva.any():
            out.append(None)
            continue
        probe = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=2000))
        probe.fit(x_tr, ytr)
        out.append(_auc(probe.decision_function(x_va), yva))
    return out


def bootstrap_ratio(a, b, *, n: int = 2000, seed: int = 0) -> dict:
    """mean(a) / mean(b) of paired samples with a 95% bootstrap interval (None where mean(b) is 0)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(n, len(a)))
    ma, mb = a[idx].mean(1), b[idx].mean(1)
    ok = mb > 0
    ratio = float(a.mean() / b.mean()) if b.mean() > 0 else None
    ci = [float(x) for x in np.percentile(ma[ok] / mb[ok], [2.5, 97.5])] if ok.mean() > 0.95 else None
    return {"with": float(a.mean()), "without": float(b.mean()), "with_sd": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
            "without_sd": float(b.std(ddof=1)) if len(b) > 1 else 0.0, "ratio": ratio,
            "ratio_ci95": ci,
            "difference": float(a.mean() - b.mean()),
            "difference_ci95": [float(x) for x in np.percentile(ma - mb, [2.5, 97.5])]}


@torch.no_grad()
def sample_steered(model, tok, prompts: list[list[int]], new_tokens: int, *, seed: int, intervene: dict | None = None,
                   attribute: bool = True, epsilon_off: bool = False, logit_mask: torch.Tensor | None = None,
                   residual: tuple[int, torch.Tensor] | None = None) -> dict:
    """One sample per prompt (prompts of one length; row i draws with a generator seeded seed + i),
    each continued for up to new_tokens tokens, one forward pass per token (the block-causal variant predicts an
    appended [MASK]); `intervene` {concept: weight} at every position (with epsilon_off a weight
    None keeps the concept's current one: a null edit), ε held
    (steer.edit_keeping_epsilon), or, with epsilon_off, the model's own intervention (the
    release's: ε switched off, the head reads k̂ + û). logit_mask (v,): subtracted from the
    logits tokens are sampled from (the release's relu_logit_mask, steer.prepare_steering's
    relu_suppression; a logit bias is a negative mask); the attribution records the model's logits
    before it. residual (layer, vector): the vector added to the residual stream at that layer
    (nulls.residual_added) in the steered pass, not in the unsteered one that scores the NLL. Returns the generated ids
    per sample (cut after <|eoc|>), the unsteered model's log-likelihood of each generated token,
    and, with attribute, the known contribution per concept summed over each sample's tokens
    plus a GenerationAttribution of every sampled logit."""
    import dataclasses

    from penrose_zoo.steerling.attribution import GenerationAttribution, active_concepts, concept_attribution, forward_ids
    from penrose_zoo.steerling.steer import edit_keeping_epsilon

    device = model.lm_head_weight().device
    if len({len(p) for p in prompts}) != 1:
        raise ValueError("sample_steered: the prompts must have one length (they run as one batch)")
    n, plen = len(prompts), len(prompts[0])
    ids = torch.tensor(prompts, dtype=torch.long, device=device)
    gens = [torch.Generator().manual_seed(seed + i) for i in range(n)]
    banned = [tok.pad_id, tok.bos_id, tok.mask_id]
    alive = torch.ones(n, dtype=torch.bool)
    length = torch.zeros(n, dtype=torch.long)
    nll = torch.zeros(n, dtype=torch.float64)
    n_known = model.sizes["c"]
    credit = torch.zeros(n, n_known, dtype=torch.float64)
    rec: dict[str, list] = {k: [] for k in ("tid", "logit", "kid", "kw", "kc", "uid", "uw", "uc", "eps", "live")}
    kw = {"intervene_known": dict(intervene)} if intervene else {}
    block = model.model_config["block_size"]
    for _ in range(new_tokens):
        if ids.shape[1] + 1 > block or not alive.any():
            break
        x = torch.cat([ids, torch.full((n, 1), tok.mask_id, device=device)], 1) if model.variant == "block_causal" else ids
        plain = forward_ids(model, x)
        if residual is not None:
            from penrose_zoo.steerling.nulls import residual_added

            with residual_added(model, *residual):
                out = forward_ids(model, x)
        elif not kw:
            out = plain
        elif epsilon_off:  # a value None: the concept's current weight (a null edit that switches ε off)
            vals = {c: (plain.known_weights[..., c] if v is None else v) for c, v in kw["intervene_known"].items()}
            out = forward_ids(model, x, intervene_known=vals)
        else:
            out = edit_keeping_epsilon(model, plain, kw["intervene_known"])
        logits = out.logits[:, -1].float().clone()
        if logit_mask is not None:
            logits -= logit_mask.to(logits.device, logits.dtype)
        logits[:, banned] = -math.inf
        probs = torch.softmax(logits, -1).cpu()
        nxt = torch.stack([torch.multinomial(probs[i], 1, generator=gens[i])[0] for i in range(n)]).to(device)
        lp = torch.log_softmax(plain.logits[:, -1].float(), -1).gather(-1, nxt[:, None])[:, 0].cpu().double()
        live = alive.clone()
        nll += torch.where(live, -lp, torch.zeros_like(lp))
        length += live.long()
        if attribute:
            last = dataclasses.replace(out, **{f: getattr(out, f)[:, -1:] for f in (
                "logits", "hidden", "known_features", "unknown_features", "epsilon", "composed", "known_logits",
                "known_weights", "unknown_logits", "unknown_weights") if getattr(out, f) is not None})
            attr = concept_attribution(model, last, nxt[:, None])
            kid, kc = attr.known_ids[:, 0], attr.known[:, 0, 0].double().cpu()  # (n, k)
            credit.scatter_add_(1, kid.cpu(), torch.where(live[:, None], kc, torch.zeros_like(kc)))
            _, kwt = active_concepts(last, "known")
            uid, uwt = active_concepts(last, "unknown")
            for key, v in (("tid", nxt[:, None]), ("logit", attr.logit[:, 0]), ("kid", kid), ("kw", kwt[:, 0]),
                           ("kc", attr.known[:, 0, 0]), ("uid", uid[:, 0]), ("uw", uwt[:, 0]),
                           ("uc", attr.unknown[:, 0, 0]), ("eps", attr.epsilon[:, 0]), ("live", live[:, None])):
                rec[key].append(v.cpu())
        ids = torch.cat([ids, nxt[:, None]], 1)
        alive &= (nxt.cpu() != tok.eoc_id)
    gen = [ids[i, plen:plen + int(length[i])].tolist() for i in range(n)]
    result: dict[str, Any] = {"generated": gen, "nll": (nll / length.clamp_min(1)).tolist(), "tokens": length.tolist()}
    if attribute and rec["tid"]:
        live = torch.cat(rec["live"], 1)

        def cat(key, k=None):
            v = torch.cat([r if r.dim() == 3 else r[:, :, None] if k else r for r in rec[key]], 1)
            return v

        def stack3(key):  # (n, T, k), k padded to the widest step (a set weight can drop a concept)
            width = max(r.shape[-1] for r in rec[key])
            return torch.stack([torch.nn.functional.pad(r, (0, width - r.shape[-1])) for r in rec[key]], 1)

        def z3(v):
            return v * live[..., None].to(v.dtype)

        def z2(v):
            return v * live.to(v.dtype)

        ga = GenerationAttribution(target_token_ids=cat("tid"), target_logits=z2(cat("logit").float()),
                                   known_indices=stack3("kid"), known_weights=z3(stack3("kw").float()),
                                   known_contributions=z3(stack3("kc").float()), unk_indices=stack3("uid"),
                                   unk_weights=z3(stack3("uw").float()), unk_contributions=z3(stack3("uc").float()),
                                   epsilon_contribution=z2(cat("eps").float()), committed=live)
        result["attribution"] = ga
        result["credit"] = credit
    return result


def _rate(ids, tok, corpus, concept: str) -> float:
    from penrose_zoo.steerling.planted import text_concept_rates

    return text_concept_rates(tok.decode(ids, skip_special_tokens=True), corpus)[concept]


def known_answer(checkpoint, *, samples: int = 64, new_tokens: int = 48, strength: float = 1.0, max_batches: int = 32,
                 seed: int = 0, concepts: list[str] | None = None, epsilon_off: bool = False,
                 unlearn_strength: float = 20.0, null: str | None = None, baselines=(), layer: int | None = None,
                 suppression: bool = True) -> dict:
    """Every measurement of the module doc on a training checkpoint (a dict; format_report prints it).
    concepts: the labelled concepts steered (default all; [] none); unlearn_strength: the relu logit
    mask's strength of the release's unlearning recipe (0: not measured). null: measure a null of
    the checkpoint instead (penrose_zoo.steerling.nulls.NULLS: 'random_init', 'shuffled_k'; seeded by
    `seed`). baselines: steering baselines (nulls.BASELINES) run beside each injection at the
    injection's KL; layer: their layer (default n_layers // 2). suppression: measure the clamp and
    the unlearning (False: injection only)."""
    import random

    from penrose.errors import PenroseError
    from penrose_zoo.steerling import measure
    from penrose_zoo.steerling.attribution import concept_attribution, forward_ids
    from penrose_zoo.steerling.checkpoints import load_checkpoint
    from penrose_zoo.steerling.planted import MANIFEST, load_planted, packed_token_labels
    from penrose_zoo.steerling.steer import SteeringConfig, prepare_steering
    from penrose_zoo.steerling.train import TrainConfig, batch_of, data_dir, load_corpus, packed

    from penrose.errors import PenroseArgumentError
    from penrose_zoo.validate import flag, number, whole

    samples, new_tokens = whole(samples, "samples", low=1), whole(new_tokens, "new_tokens", low=1)
    strength, unlearn_strength = number(strength, "strength"), number(unlearn_strength, "unlearn_strength", low=0)
    max_batches, seed = whole(max_batches, "max_batches", low=1), whole(seed, "seed", low=0, high=2**32 - 1)
    epsilon_off, suppression = flag(epsilon_off, "epsilon_off"), flag(suppression, "suppression")
    from penrose_zoo.steerling import nulls as nl

    if null is not None and null not in nl.NULLS:
        raise PenroseArgumentError(f"null must be one of {', '.join(nl.NULLS)} (the trained nulls "
                                   f"{', '.join(nl.TRAINED_NULLS)} are checkpoints of their own), got {null!r}")
    if isinstance(baselines, str) or not all(b in nl.BASELINES for b in baselines):
        raise PenroseArgumentError(f"baselines must be a list of {', '.join(nl.BASELINES)}, got {baselines!r}")
    baselines = list(dict.fromkeys(baselines))
    if baselines and epsilon_off:
        raise PenroseArgumentError("the steering baselines are matched to the ε-held edit; leave epsilon_off off")
    if concepts is not None and (isinstance(concepts, str) or not all(isinstance(c, str) for c in concepts)):
        raise PenroseArgumentError(f"concepts must be a list of concept names, got {concepts!r}")
    model, tok, names, state = load_checkpoint(checkpoint)
    model.eval()
    cfg = TrainConfig(**state["config"]).resolved()
    permutation = None
    if null == "random_init":
        model = nl.reinitialised(model, seed=seed)
    elif null == "shuffled_k":
        permutation = nl.shuffle_known_embeddings(model, seed=seed)
    layer = model.sizes["L"] // 2 if layer is None else layer
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= model.sizes["L"]:
        raise PenroseArgumentError(f"layer must be a whole number from 0 to {model.sizes['L']}, got {layer!r}")
    where = data_dir(cfg.data)
    if not (Path(where) / MANIFEST).is_file():
        raise PenroseError(f"{checkpoint} was trained on {where!r}, which holds no planted corpus ({MANIFEST}); "
                           "known-answer needs one (penrose steerling planted --out DIR)")
    planted = load_planted(where)
    unknown = [c for c in concepts or () if c not in names]
    if unknown:
        raise PenroseError(f"--steer: {', '.join(map(repr, unknown))} not among the labelled concepts {', '.join(names)}")
    truth = planted.by_text()
    all_names = list(names) + [n for n in planted.names if n not in names]  # labelled, then withheld
    withheld = [n for n in planted.config.withheld_names]
    corpus = load_corpus(cfg)
    changed = next((c.text for c in (*corpus.train, *corpus.val) if c.text not in truth), None)
    if changed is not None:  # (its truth is unknown: every measure below reads it)
        raise PenroseError(f"{where}: the chunk {changed[:60]!r}... is not in {MANIFEST}: the corpus was changed after "
                           "`penrose steerling planted` wrote it")
    train_data, val_data = packed(cfg, corpus, tok)
    byte_tok = type(tok).__name__ == "ByteTokenizer"

    def rows_of(data, limit):
        out = []
        tl = packed_token_labels(data, planted, names) if byte_tok else None
        for i in range(0, min(data.n_rows, limit * cfg.batch_size), cfg.batch_size):
            rows = torch.arange(i, min(i + cfg.batch_size, data.n_rows))
            out.append((batch_of(data, rows), None if tl is None else tl[rows]))
        return out

    def truth_labels_of(data):
        def f(batch):
            y = torch.zeros(batch.chunk_ids.shape[0], len(all_names))
            for j, cid in enumerate(batch.chunk_ids.tolist()):
                for c in truth[data.texts[cid]].concepts:
                    y[j, all_names.index(c)] = 1.0
            return y
        return f

    tr_b, va_b = rows_of(train_data, max_batches), rows_of(val_data, max_batches)
    train_truth = truth_labels_of(train_data)
    tr = chunk_pool(model, tr_b, truth_labels_of(train_data))
    va = chunk_pool(model, va_b, truth_labels_of(val_data))
    n = len(names)
    det = [_auc(va["known"][:, j], va["labels"][:, j]) for j in range(n)]
    probe = probe_aucs(tr["h"], tr["labels"], va["h"], va["labels"])
    tok_auc = ([_auc(va["token_prob"][:, j], va["token_labels"][:, j]) for j in range(n)] if "token_prob" in va
               else [None] * n)

    def mean(xs):
        xs = [x for x in xs if x is not None]
        return float(np.mean(xs)) if xs else None

    detection = {"per_concept": {names[j]: {"module_auc": det[j], "probe_auc": probe[j], "token_auc": tok_auc[j]}
                                 for j in range(n)},
                 "module_auc_mean": mean(det), "probe_auc_mean": mean(probe), "token_auc_mean": mean(tok_auc),
                 "val_chunks": int(va["labels"].shape[0]), "train_chunks": int(tr["labels"].shape[0])}

    # logit share, held-out attribution precision, attribution error
    shares, errors, hits, chance, counted = [], [], 0, [], 0
    active_known: list[torch.Tensor] = []
    active_frac: list[tuple[int, int]] = []
    val_truth = truth_labels_of(val_data)
    for batch, _ in va_b:
        out = forward_ids(model, batch.input_ids)
        planted_labels = val_truth(batch)[:, :n]  # the truth, not the labels trained on (a shuffled-label null)
        ls = measure.logit_share(model, out, valid=batch.valid)
        shares.append((ls["mean_share_concept"], ls["mean_share_known"]))
        active = batch.valid & (out.known_weights.float().amax(-1) > 0.5)  # some known concept on
        active_known.append(ls["share_known"][..., 0][active])
        active_frac.append((int(active.sum()), int(batch.valid.sum())))
        targets = torch.cat([batch.input_ids[:, 1:], batch.input_ids[:, -1:]], 1)
        attr = concept_attribution(model, out, targets)
        errors.append(attr.error)
        c = batch.chunk_labels.shape[0]
        nxt = torch.cat([batch.chunk_index[:, 1:], torch.full_like(batch.chunk_index[:, :1], -1)], 1)
        keep = (batch.chunk_index >= 0) & (nxt == batch.chunk_index)  # predicting a token of the same chunk
        credit = torch.zeros(c, n, dtype=torch.float64)
        contrib = attr.known[:, :, 0].double()  # (b, t, k)
        ids = attr.known_ids
        for (bi, ti) in keep.nonzero().tolist():
            credit[batch.chunk_index[bi, ti]].index_add_(0, ids[bi, ti], contrib[bi, ti])
        for j in range(c):
            labels = planted_labels[j]
            if labels.sum() == 0:
                continue
            counted += 1
            hits += bool(labels[int(credit[j].argmax())] > 0)
            chance.append(float(labels.sum()) / n)
    attribution: dict[str, Any] = {"heldout_precision": hits / max(counted, 1), "heldout_chance": float(np.mean(chance)),
                   "heldout_chunks": counted, "max_error": float(max(errors)),
                   "detector": nl.detector_precision(va["known"], va["labels"][:, :n])}
    act = torch.cat(active_known)
    share = {"concept": float(np.mean([s[0] for s in shares])), "known": float(np.mean([s[1] for s in shares])),
             "known_where_active": float(act.mean()) if act.numel() else None,
             "active_fraction": sum(a for a, _ in active_frac) / max(sum(b for _, b in active_frac), 1)}

    # unknown concepts vs the withheld ones
    recovery = {}
    for w in withheld:
        j = all_names.index(w)
        tr_auc = [_auc(tr["unknown"][:, u], tr["labels"][:, j]) or 0.0 for u in range(tr["unknown"].shape[1])]
        best = int(np.argmax(tr_auc))
        recovery[w] = {"unknown_concept": best, "train_auc": tr_auc[best],
                       "val_auc": _auc(va["unknown"][:, best], va["labels"][:, j]),
                       "probe_auc": probe_aucs(tr["h"], tr["labels"][:, [j]], va["h"], va["labels"][:, [j]])[0],
                       "prevalence": float(va["labels"][:, j].mean())}

    # steering and attribution of generations
    rng = random.Random(seed)
    f = planted.filler

    def neutral():
        return f"{rng.choice(f['det'])} {rng.choice(f['noun'])} {rng.choice(f['verb'])} {rng.choice(f['det'])} {rng.choice(f['noun'])}."

    groups = 8
    per = max(samples // groups, 1)
    def one_length(texts):  # up to `groups` prompts of the most common token length: one batch
        enc = [tok.prompt_ids(x) for x in dict.fromkeys(texts)]
        if not enc:  # no validation chunk carries the concept: nothing to suppress
            return []
        modal = max(set(map(len, enc)), key=lambda n: sum(len(x) == n for x in enc))
        return [x for x in enc if len(x) == modal][:groups]

    neutral_prompts = one_length(neutral() for _ in range(400))

    def run(prompts, intervene, logit_mask=None, residual=None):
        """Every prompt `per` times, as one batch (seeds fixed by position, so conditions pair up)."""
        rows = [p for p in prompts for _ in range(per)]
        r = sample_steered(model, tok, rows, new_tokens, seed=seed * 100_003, intervene=intervene, epsilon_off=epsilon_off,
                           logit_mask=logit_mask, residual=residual)
        return {"generated": r["generated"], "nll": r["nll"], "tokens": r["tokens"], "credit": r["credit"],
                "att": [r["attribution"].verify()]}

    def precision(res):
        from penrose_zoo.steerling.planted import text_concept_rates

        hits = counted = 0
        for ids, cr in zip(res["generated"], res["credit"]):
            rates = text_concept_rates(tok.decode(ids, skip_special_tokens=True), planted)
            present = {names.index(c) for c, r in rates.items() if r > 0 and c in names}
            if not present:
                continue
            counted += 1
            hits += int(cr.argmax()) in present
        return {"precision": hits / counted if counted else None, "chunks": counted}

    # the unsteered baseline: no edit, ε as the steered runs have it (not `null`: that names the model's null)
    null_edit = {0: None} if epsilon_off else None
    base = run(neutral_prompts, null_edit)
    steering = {}
    gen_attr: dict[str, Any] = {"unsteered": precision(base), "verified": all(v.passed for v in base["att"]),
                "max_error": max(v.max_abs_error for v in base["att"])}
    injected_prec = []
    val_texts = [truth[t] for t in val_data.texts]
    def all_rates(res):
        from penrose_zoo.steerling.planted import text_concept_rates

        return [text_concept_rates(tok.decode(g, skip_special_tokens=True), planted) for g in res["generated"]]

    base_rates = all_rates(base)
    kl_batches = [b for b, _ in va_b[:2]]
    steered_rates: dict[str, dict[str, list]] = {"model": {}, **{b: {} for b in baselines}}
    for cname in (list(names) if concepts is None else concepts):
        cid = names.index(cname)
        inj = run(neutral_prompts, {cid: float(strength)})
        steered_rates["model"][cname] = all_rates(inj)
        ip = precision(inj)
        injected_prec.append(ip)
        gen_attr["verified"] &= all(v.passed for v in inj["att"])
        gen_attr["max_error"] = max(gen_attr["max_error"], *(v.max_abs_error for v in inj["att"]))
        r_inj = [_rate(g, tok, planted, cname) for g in inj["generated"]]
        r_base = [_rate(g, tok, planted, cname) for g in base["generated"]]
        # suppression: prompts that express the concept (one of its sentences from a validation chunk)
        sentences = []
        for ch in val_texts:
            for s0, e0, c0 in ch.spans:
                if c0 == cname:
                    a = ch.text.rfind(". ", 0, s0)
                    b = ch.text.find(".", e0)
                    sentences.append(ch.text[a + 2 if a >= 0 else 0:b + 1])
        sup_prompts = one_length(sentences) if suppression else []  # none when no validation chunk carries c
        sup = run(sup_prompts, {cid: 0.0}) if sup_prompts else None
        keep = run(sup_prompts, null_edit) if sup_prompts else None
        # the release's unlearning (SteeringConfig.injection_relu): the relu logit mask of the concept,
        # strength · relu(W K_c), subtracted from the sampling logits, with the weight clamped to 0
        unl = None
        if sup_prompts and unlearn_strength:
            mask = prepare_steering(model, SteeringConfig(relu_logit_mask={cid: float(unlearn_strength)})).relu_suppression
            unl = run(sup_prompts, {cid: 0.0}, logit_mask=mask)
        rates_keep = None if keep is None else [_rate(g, tok, planted, cname) for g in keep["generated"]]
        steering[cname] = {
            "inject": bootstrap_ratio(r_inj, r_base, seed=seed),
            "suppress": None if sup is None or rates_keep is None else bootstrap_ratio(
                [_rate(g, tok, planted, cname) for g in sup["generated"]], rates_keep, seed=seed),
            "unlearn": None if unl is None or rates_keep is None else bootstrap_ratio(
                [_rate(g, tok, planted, cname) for g in unl["generated"]], rates_keep, seed=seed),
            "nll": {"unsteered": float(np.mean(base["nll"])), "injected": float(np.mean(inj["nll"])),
                    "suppress_prompts": None if keep is None else float(np.mean(keep["nll"])),
                    "suppressed": None if sup is None else float(np.mean(sup["nll"])),
                    "unlearned": None if unl is None else float(np.mean(unl["nll"]))},
            "generated_tokens_mean": float(np.mean(inj["tokens"])),
            "injected_attribution_precision": ip["precision"],
        }
        if baselines:
            model_edit = nl.Edit("weight", float(strength), concept=cid)
            target = nl.edit_kl(model, kl_batches, model_edit)
            steering[cname]["kl"] = target
            steering[cname]["baselines"] = {}
            for bname in baselines:
                if bname == "logit_bias":
                    edit = nl.Edit("logit_bias", 0.0, tokens=tuple(nl.word_token_ids(tok, planted, cname)))
                else:
                    j = all_names.index(cname)
                    try:
                        vec = (nl.mean_difference(model, [b for b, _ in tr_b], lambda b: train_truth(b)[:, j] > 0, layer)
                               if bname == "activation_addition" else model.concept_embeddings("known")[cid].detach().float())
                    except ValueError:  # no measured training chunk carries c (or every one does): not measured
                        steering[cname]["baselines"][bname] = None
                        continue
                    edit = nl.Edit("residual", 0.0, vector=vec, layer=layer)
                s_b, kl_b = nl.match_strength(lambda x: nl.edit_kl(model, kl_batches, edit.at(x)), target)
                edit = edit.at(s_b)
                bias = edit.bias(model.vocab_size)
                res = run(neutral_prompts, None, logit_mask=None if bias is None else -bias, residual=edit.residual())
                steered_rates[bname][cname] = all_rates(res)
                steering[cname]["baselines"][bname] = {
                    "inject": bootstrap_ratio([r[cname] for r in steered_rates[bname][cname]], r_base, seed=seed),
                    "strength": s_b, "kl": kl_b, "nll": float(np.mean(res["nll"])),
                    "kl_matched": abs(kl_b - target) <= 0.05 * target}
    hitsum = sum((p["precision"] or 0) * p["chunks"] for p in injected_prec)
    cnt = sum(p["chunks"] for p in injected_prec)
    gen_attr["injected"] = {"precision": hitsum / cnt if cnt else None, "chunks": cnt}
    attribution["generated"] = gen_attr
    ratios = [s["inject"]["ratio"] for s in steering.values() if s["inject"]["ratio"] is not None]
    sratios = [s["suppress"]["ratio"] for s in steering.values() if s["suppress"] and s["suppress"]["ratio"] is not None]
    uratios = [s["unlearn"]["ratio"] for s in steering.values() if s["unlearn"] and s["unlearn"]["ratio"] is not None]
    spec = {m: nl.specificity(rs, base_rates, list(names)) for m, rs in steered_rates.items() if rs}
    base_summary = {}
    for bname in baselines:
        br = [(s["baselines"][bname] or {"inject": {"ratio": None}})["inject"]["ratio"] for s in steering.values()]
        mr = [s["inject"]["ratio"] for s in steering.values()]
        pairs = [(m, b) for m, b in zip(mr, br) if m is not None and b is not None]
        base_summary[bname] = {"inject_ratio_median": float(np.median([b for _, b in pairs])) if pairs else None,
                               "model_beats": sum(m > b for m, b in pairs), "concepts": len(pairs)}
    return {
        "null": null, "null_permutation": permutation, "layer": layer, "baselines": baselines,
        "specificity": spec, "specificity_diagonal": {m: (float(np.median([v[c] for c, v in mat.items() if v[c] is not None]))
                                                          if any(v[c] is not None for c, v in mat.items()) else None)
                                                      for m, mat in spec.items()},
        "checkpoint": str(checkpoint), "step": state["step"], "variant": cfg.variant, "epsilon": cfg.epsilon,
        # (the untrained null has no validation loss of its own: the checkpoint's is the trained model's)
        "data": where, "val_loss": float(state["history"]["val"][-1]["token"])
        if state["history"]["val"] and null != "random_init" else None,
        "known_concepts": list(names), "withheld": withheld,
        "detection": detection, "logit_share": share, "attribution": attribution, "unknown_recovery": recovery,
        "steering": steering, "strength": strength, "unlearn_strength": unlearn_strength, "epsilon_off": epsilon_off, "samples": per * len(neutral_prompts), "new_tokens": new_tokens,
        "summary": {
            "detection_auc_mean": detection["module_auc_mean"], "probe_auc_mean": detection["probe_auc_mean"],
            "known_logit_share": share["known"], "concept_logit_share": share["concept"],
            "inject_ratio_median": float(np.median(ratios)) if ratios else None,
            "inject_ratio_min": float(min(ratios)) if ratios else None,
            "suppress_ratio_median": float(np.median(sratios)) if sratios else None,
            "suppress_ratio_max": float(max(sratios)) if sratios else None,
            "unlearn_ratio_median": float(np.median(uratios)) if uratios else None,
            "unlearn_ratio_max": float(max(uratios)) if uratios else None,
            "heldout_attribution_precision": attribution["heldout_precision"],
            "detector_attribution_precision": attribution["detector"]["precision"],
            "baselines": base_summary,
            "generated_attribution_precision": gen_attr["injected"]["precision"],
            "attribution_verified": gen_attr["verified"],
            "unknown_recovery_auc": mean([r["val_auc"] for r in recovery.values()]),
        },
    }


def format_report(r: dict) -> str:
    def f(x, spec=".3f"):
        return "—" if x is None else format(x, spec)

    def ci(c):
        return "—" if c is None else f"{c[0]:.2f}–{c[1]:.2f}"

    s = r["summary"]
    null = {"random_init": "NULL: untrained, initialised from the seed", "shuffled_k": "NULL: K shuffled across concepts "
            f"{r.get('null_permutation')}"}.get(r.get("null") or "", None)
    lines = [f"{r['checkpoint']} ({r['variant']}, {'ε on' if r['epsilon'] else 'pure bottleneck'}, step {r['step']}, "
             f"val loss {f(r['val_loss'])})" + ("" if null is None else f"  [{null}]"),
             f"detection AUC (validation chunks): module {f(s['detection_auc_mean'])}  linear probe on h "
             f"{f(s['probe_auc_mean'])}  token-level {f(r['detection']['token_auc_mean'])}"]
    for name, d in r["detection"]["per_concept"].items():
        lines.append(f"  {name:>10}: module {f(d['module_auc'])}  probe {f(d['probe_auc'])}  token {f(d['token_auc'])}")
    ls = r.get("logit_share", {})
    lines.append(f"logit share: concepts {f(s['concept_logit_share'])}  known {f(s['known_logit_share'])}"
                 + ("" if ls.get("known_where_active") is None else
                    f"  known where a known concept is on {f(ls['known_where_active'])} "
                    f"({ls['active_fraction']:.1%} of positions)"))
    lines.append(f"steering ({r['samples']} samples x {r['new_tokens']} tokens, strength {r['strength']}, "
                 f"{'ε switched off' if r.get('epsilon_off') else 'ε held'}): "
                 "rate of the concept's words, with / without [95% CI of the ratio]; NLL under the unsteered model; "
                 f"unlearn: weight 0 and the relu logit mask of strength {r.get('unlearn_strength')}")
    for name, st in r["steering"].items():
        i, p, u = st["inject"], st["suppress"], st.get("unlearn")
        sup = ("suppress — (no validation chunk carries it)  " if p is None else
               f"suppress {p['with']:.3f}/{p['without']:.3f} x{f(p['ratio'], '.2f')} [{ci(p['ratio_ci95'])}]  ")
        if u is not None:
            sup += f"unlearn x{f(u['ratio'], '.2f')} [{ci(u['ratio_ci95'])}] NLL {f(st['nll']['unlearned'], '.2f')}  "
        lines.append(f"  {name:>10}: inject {i['with']:.3f}/{i['without']:.3f} x{f(i['ratio'], '.2f')} [{ci(i['ratio_ci95'])}]"
                     f"  {sup}NLL {st['nll']['unsteered']:.2f} -> {st['nll']['injected']:.2f} (inject)"
                     + ("" if p is None else f", {st['nll']['suppress_prompts']:.2f} -> {st['nll']['suppressed']:.2f} (suppress)")
                     + ("" if st.get("kl") is None else f"  KL {st['kl']:.3f}"))
        for bname, b in (st.get("baselines") or {}).items():
            if b is None:
                lines.append(f"  {'':>10}  {bname}: not measured (no measured training chunk with and without the concept)")
                continue
            bi = b["inject"]
            lines.append(f"  {'':>10}  {bname} (strength {b['strength']:.3g}, KL {b['kl']:.3f}): {bi['with']:.3f}/"
                         f"{bi['without']:.3f} x{f(bi['ratio'], '.2f')} [{ci(bi['ratio_ci95'])}]  NLL {b['nll']:.2f}")
    for bname, b in (s.get("baselines") or {}).items():
        lines.append(f"baseline {bname} at the injection's KL (layer {r.get('layer')}): median ratio "
                     f"x{f(b['inject_ratio_median'], '.2f')}; the model's injection beats it for {b['model_beats']} of "
                     f"{b['concepts']} concepts")
    for m, mat in (r.get("specificity") or {}).items():
        cols = list(next(iter(mat.values())))
        lines.append(f"specificity ({m}): rows steered, columns the rate ratio of each concept's words")
        lines.append("  " + " " * 10 + "".join(f"{c[:7]:>8}" for c in cols))
        for c, row in mat.items():
            lines.append(f"  {c:>10}" + "".join(f"{f(row[d], '.2f'):>8}" for d in cols))
    a = r["attribution"]
    g = a["generated"]
    lines.append(f"attribution: held-out precision {a['heldout_precision']:.3f} (chance {a['heldout_chance']:.3f}, "
                 f"{a['heldout_chunks']} chunks), max error {a['max_error']:.1e}; generated: unsteered "
                 f"{f(g['unsteered']['precision'])} ({g['unsteered']['chunks']}), injected {f(g['injected']['precision'])} "
                 f"({g['injected']['chunks']}); verify() {'exact' if g['verified'] else 'FAILED'} (max error {g['max_error']:.1e})")
    if a.get("detector"):
        lines.append(f"detector-only attribution (the chunk's top concept by presence): precision "
                     f"{f(a['detector']['precision'])} ({a['detector']['chunks']} chunks)")
    for w, rec in r["unknown_recovery"].items():
        lines.append(f"withheld {w!r} (prevalence {rec['prevalence']:.2f}): best unknown concept #{rec['unknown_concept']} "
                     f"AUC {f(rec['val_auc'])} (train {rec['train_auc']:.3f}); probe on h {f(rec['probe_auc'])}")
    return "\n".join(lines)


def run_nulls(data: str | Path, out: str | Path, *, seeds=(0, 1, 2), steps: int = 600, preset: str = "small",
              tokenizer: str = "bpe", bpe_vocab: int = 512, teacher_forcing: bool = True,
              lambda_bottleneck: float = 1.0, samples: int = 32, new_tokens: int = 32, strength: float = 2.0,
              max_batches: int = 8, baselines=None, layer: int | None = None, nulls=None,
              log: Callable[[str], None] = print) -> dict:
    """Per seed: train the model (release form + h̄ loss, teacher forced unless teacher_forcing is
    False) and the trained nulls on `data` (a planted corpus), run known_answer on the model (with the
    baselines) and on every null (injection only); write OUT/nulls.json and return
    {"config", "runs": {model or null: [result per seed]}, "table": nulls.nulls_table(runs)}. Checkpoints
    and results are cached under OUT (a rerun, or runs of other seeds into the same OUT, reuse them)."""
    import json

    from penrose_zoo.steerling import nulls as nl
    from penrose_zoo.steerling.train import TrainConfig, train

    baselines = nl.BASELINES if baselines is None else baselines
    nulls = (*nl.TRAINED_NULLS, *nl.NULLS) if nulls is None else nulls
    out, data = Path(out), Path(data)
    unknown = [n for n in nulls if n not in (*nl.TRAINED_NULLS, *nl.NULLS)]
    if unknown:
        raise ValueError(f"unknown null(s) {', '.join(unknown)}; choose from {', '.join((*nl.TRAINED_NULLS, *nl.NULLS))}")
    (out / "results").mkdir(parents=True, exist_ok=True)
    config = {"data": str(data), "seeds": list(seeds), "steps": steps, "preset": preset, "tokenizer": tokenizer,
              "bpe_vocab": bpe_vocab, "teacher_forcing": teacher_forcing, "lambda_bottleneck": lambda_bottleneck,
              "samples": samples, "new_tokens": new_tokens, "strength": strength, "max_batches": max_batches,
              "baselines": list(baselines), "layer": layer, "nulls": list(nulls)}

    def trained(name: str, seed: int, corpus: Path, **kw) -> Path:
        ck = out / "checkpoints" / f"{name}-s{seed}"
        cfg = TrainConfig(preset=preset, data=str(corpus), variant="causal", epsilon=True, tokenizer=tokenizer,
                          bpe_vocab=bpe_vocab, steps=steps, seed=seed, lambda_bottleneck=lambda_bottleneck,
                          teacher_forcing_steps=steps if teacher_forcing else 0, **kw)
        log(f"train {name} seed {seed} -> {ck}")
        train(cfg, ck, val_every=max(steps // 4, 1), save_every=steps, progress=False, log=lambda *a, **k: None)
        return ck

    def measured(name: str, seed: int, ck: Path, **kw) -> dict:
        path = out / "results" / f"{name}-s{seed}.json"
        if path.is_file():
            return json.loads(path.read_text())
        log(f"known-answer {name} seed {seed}")
        r = known_answer(ck, samples=samples, new_tokens=new_tokens, strength=strength, max_batches=max_batches,
                         seed=seed, layer=layer, **kw)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(r, default=float))
        tmp.replace(path)
        return r

    runs: dict[str, list[dict]] = {m: [] for m in ("model", *nulls)}
    for seed in seeds:
        ck = trained("model", seed, data)
        runs["model"].append(measured("model", seed, ck, baselines=list(baselines)))
        for n in nulls:
            if n == "shuffled_labels":
                shuffled = out / "corpora" / f"shuffled-labels-s{seed}"
                if not (shuffled / ".planted.json").is_file():
                    nl.shuffle_labels(data, shuffled, seed=seed, replace=True)
                r = measured(n, seed, trained(n, seed, shuffled), suppression=False)
            elif n == "lambda0":
                r = measured(n, seed, trained(n, seed, data, lambda_concept=0.0), suppression=False)
            else:
                r = measured(n, seed, ck, null=n, suppression=False)
            runs[n].append(r)
    table = nl.nulls_table(runs)
    result = {"config": config, "runs": runs, "table": table}
    (out / "nulls.json").write_text(json.dumps(result, default=float, indent=1))
    return result
