"""Scaling of base vs concept-module Steerling models: the post's "interpretability behaves like a
fixed tax" claim, tested at toy scale.

    penrose steerling scaling [--quick | --tiny] --out DIR [--json] [--device cpu|cuda]

For every family (causal next-token, block-causal masked diffusion), size, seed and variant, a
model of the same backbone is trained in memory on one corpus (fortunes by default, or --data, a
folder of category files; penrose_zoo.steerling.lm_data) and evaluated (train.evaluate_model:
validation token loss and the metrics of penrose_zoo.steerling.measure). Variants:

  base               ε on, every concept λ = 0: the LM head reads h (a plain LM; the concept heads
                     are carried along untrained and do not touch the logits);
  release            the release's form: ε on, known and unknown heads trained with the four
                     losses (λ_concept 0.1, λ_indep 1, λ_rec 0.1), unknown head on h.detach();
  bottleneck         the post's pure bottleneck: ε off (the head reads k̂ + û), same losses;
  bottleneck_attached  the same, but the unknown head reads h without detach, so the token loss
                     reaches the backbone through û as well (train.forward_unknown_attached).
  release_hbar       the release form plus the post's token loss on h̄ = k̂ + û (λ_bottleneck 1), so
                     the known embeddings learn (not in the default --variants).
  release_hbar_tf    release_hbar with teacher forcing: the h̄ loss reads α k̂_gt + (1 − α) k̂ + û,
                     α annealed 1 → 0 over all of each size's steps (fraction 1, as the
                     known-answer run's --teacher-forcing-steps 600 of 600), so each K_c learns the
                     words its concept makes likely (not in the default --variants).

Compute C = 6·N·D, N the non-embedding backbone parameters (transformer layers and the final
norm: the same for every variant at a size), D the training tokens (steps · batch · sequence).
Per family and variant a least-squares fit log10(loss) = a + b·log10(C) over the sizes; b_std is
the spread of the per-seed exponents (ddof 1) when there are ≥ 2 seeds, else the fit's standard
error. Each concept variant is compared with base: the offset between the lines at the geometric
mean compute, and whether the exponents differ by more than 2·sqrt(b_std_base² + b_std²).
Metric trends (concept AUC, token control, HSIC, probing gap) are least-squares slopes against
log10 N with their standard errors.

DIR/results.json: {"config", "fits", "comparisons", "trends", "claims", "per_size", "seconds"};
per_size has one row per (family, variant, size, seed); DIR/runs/*.json caches each row, so a
rerun with the same settings reuses finished runs. Plots: DIR/loss_vs_compute.png and
DIR/metrics_vs_size.png.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

FORMAT = "penrose-steerling-scaling"
FAMILIES = ("causal", "block_causal")
LOSSES = dict(lambda_concept=0.1, lambda_indep=1.0, lambda_rec=0.1)
VARIANTS: dict[str, dict] = {
    "base": dict(epsilon=True, lambda_concept=0.0, lambda_indep=0.0, lambda_rec=0.0),
    "release": dict(epsilon=True, **LOSSES),
    "bottleneck": dict(epsilon=False, **LOSSES),
    "bottleneck_attached": dict(epsilon=False, unknown_detach=False, **LOSSES),
    "release_hbar": dict(epsilon=True, lambda_bottleneck=1.0, **LOSSES),
    # teacher_forcing: the fraction of a size's steps over which α anneals 1 → 0 (run_config)
    "release_hbar_tf": dict(epsilon=True, lambda_bottleneck=1.0, teacher_forcing=1.0, **LOSSES),
}
DEFAULT_VARIANTS = ("base", "release", "bottleneck", "bottleneck_attached")  # release_hbar: on request
CONCEPT_VARIANTS = tuple(v for v in VARIANTS if v != "base")

# Backbone sizes (the concept module grows with the width: 2e unknown concepts at rank e/4).
SIZES: dict[str, dict] = {
    "e8": dict(n_layers=1, n_embd=8, n_head=2, n_kv_heads=1, intermediate_size=24),
    "e16": dict(n_layers=1, n_embd=16, n_head=2, n_kv_heads=1, intermediate_size=48),
    "e32": dict(n_layers=1, n_embd=32, n_head=2, n_kv_heads=1, intermediate_size=96),
    "e48": dict(n_layers=2, n_embd=48, n_head=4, n_kv_heads=2, intermediate_size=144),
    "e64": dict(n_layers=2, n_embd=64, n_head=4, n_kv_heads=2, intermediate_size=192),
    "e96": dict(n_layers=3, n_embd=96, n_head=4, n_kv_heads=2, intermediate_size=288),
    "e128": dict(n_layers=4, n_embd=128, n_head=4, n_kv_heads=2, intermediate_size=384),
    "e192": dict(n_layers=6, n_embd=192, n_head=6, n_kv_heads=2, intermediate_size=576),
    "e256": dict(n_layers=8, n_embd=256, n_head=8, n_kv_heads=4, intermediate_size=768),
}

# Modes: sizes with their training steps (D grows with N), seeds, evaluation batches.
MODES: dict[str, dict] = {
    "tiny": dict(sizes={"e8": 12, "e16": 20}, seeds=(0,), eval_batches=2, max_chunks=300, batch_size=8, seq_len=32),
    "quick": dict(sizes={"e16": 250, "e32": 400, "e64": 600}, seeds=(0,), eval_batches=12, max_chunks=0,
                  batch_size=16, seq_len=64),
    "default": dict(sizes={"e16": 300, "e32": 450, "e48": 700, "e64": 1000}, seeds=(0, 1), eval_batches=16,
                    max_chunks=0, batch_size=16, seq_len=64),
    "cuda": dict(sizes={"e32": 600, "e64": 1000, "e128": 1600, "e192": 2400, "e256": 3200}, seeds=(0, 1),
                 eval_batches=32, max_chunks=0, batch_size=32, seq_len=128),
}
METRICS = ("concept_auc", "token_control", "hsic_linear", "hsic_rbf", "probing_gap")


# ---------------------------------------------------------------------------------------------
# Fits
# ---------------------------------------------------------------------------------------------


def least_squares(x, y) -> dict:
    """y = a + b·x by least squares: {'a', 'b', 'a_se', 'b_se', 'r2'} (standard errors NaN
    with fewer than 3 points)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("a fit needs at least two distinct x")
    X = np.stack([np.ones_like(x), x], 1)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    dof = x.size - 2
    if dof > 0:
        s2 = float(resid @ resid) / dof
        cov = s2 * np.linalg.inv(X.T @ X)
        a_se, b_se = math.sqrt(cov[0, 0]), math.sqrt(cov[1, 1])
    else:
        a_se = b_se = float("nan")
    ss = float(((y - y.mean()) ** 2).sum())
    return {"a": float(coef[0]), "b": float(coef[1]), "a_se": a_se, "b_se": b_se,
            "r2": 1.0 - float(resid @ resid) / ss if ss > 0 else 1.0}


def power_law_fit(C, loss, seeds=None) -> dict:
    """log10(loss) = a + b·log10(C) over all points; b_std from the per-seed exponents (≥ 2 seeds
    with ≥ 2 sizes each), else the regression's standard error of b."""
    C, loss = np.asarray(C, float), np.asarray(loss, float)
    f = least_squares(np.log10(C), np.log10(loss))
    per_seed = {}
    if seeds is not None:
        seeds = np.asarray(seeds)
        for s in np.unique(seeds):
            m = seeds == s
            if np.unique(C[m]).size >= 2:
                per_seed[int(s)] = least_squares(np.log10(C[m]), np.log10(loss[m]))["b"]
    if len(per_seed) >= 2:
        b_std, source = float(np.std(list(per_seed.values()), ddof=1)), "seeds"
    else:
        b_std, source = f["b_se"], "regression"
    return {**f, "b_std": b_std, "b_std_source": source, "b_per_seed": per_seed}


# exponents equal up to rounding are equal: with seeds that agree exactly (b_std = 0) a difference
# of 1e-16 from the fits' arithmetic would otherwise count as "the exponents differ"
_EXPONENT_TOL = 1e-9


def _finite(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def analyse(rows: list[dict]) -> dict:
    """fits, comparisons (concept variants vs base), trends (metrics vs log10 N), claims."""
    fits, comparisons, trends = [], [], []
    by: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        by.setdefault((r["family"], r["variant"]), []).append(r)
    for (family, variant), rs in sorted(by.items()):
        rs = sorted(rs, key=lambda r: (r["C"], r["seed"]))
        if len({r["C"] for r in rs}) < 2:
            continue
        law = power_law_fit([r["C"] for r in rs], [r["val_loss"] for r in rs], [r["seed"] for r in rs])
        fits.append({"family": family, "variant": variant, "metric": "val_loss", **law,
                     "points": [{"size": r["size"], "seed": r["seed"], "N": r["N"], "D": r["D"], "C": r["C"],
                                 "val_loss": r["val_loss"]} for r in rs]})
        for m in METRICS:
            pts = [(math.log10(r["N"]), r[m]) for r in rs if r.get(m) is not None and math.isfinite(r[m])]
            if len({p[0] for p in pts}) < 2:
                continue
            t = least_squares(*zip(*pts))
            vals = [p[1] for p in pts]
            trends.append({"family": family, "variant": variant, "metric": m, "slope_per_decade_N": t["b"],
                           "slope_se": _finite(t["b_se"]), "mean": float(np.mean(vals)),
                           "first": vals[0], "last": vals[-1]})
    fit_of = {(f["family"], f["variant"]): f for f in fits}
    for family in FAMILIES:
        base = fit_of.get((family, "base"))
        if base is None:
            continue
        x0 = float(np.mean([math.log10(p["C"]) for p in base["points"]]))
        for v in CONCEPT_VARIANTS:
            f = fit_of.get((family, v))
            if f is None:
                continue
            off = (f["a"] + f["b"] * x0) - (base["a"] + base["b"] * x0)
            diff = f["b"] - base["b"]
            sd = math.sqrt(base["b_std"] ** 2 + f["b_std"] ** 2) if math.isfinite(base["b_std"]) and math.isfinite(
                f["b_std"]) else float("nan")
            tax: dict[str, list[float]] = {}
            for p in f["points"]:
                q = [b["val_loss"] for b in base["points"] if b["size"] == p["size"] and b["seed"] == p["seed"]]
                if q:
                    tax.setdefault(p["size"], []).append(p["val_loss"] - q[0])
            comparisons.append({
                "family": family, "variant": v, "log10_C0": x0,
                "offset_log10_loss": off, "loss_ratio": 10 ** off,
                "loss_base_at_C0": 10 ** (base["a"] + base["b"] * x0), "loss_at_C0": 10 ** (f["a"] + f["b"] * x0),
                "b_base": base["b"], "b": f["b"], "b_diff": diff, "b_diff_std": _finite(sd),
                "exponents_differ": bool(math.isfinite(sd) and abs(diff) > 2 * sd + _EXPONENT_TOL),
                "tax_per_size": {s: float(np.mean(t)) for s, t in tax.items()},
            })
    return {"fits": fits, "comparisons": comparisons, "trends": trends, "claims": claims(comparisons, trends)}


def claims(comparisons: list[dict], trends: list[dict]) -> dict:
    """The post's five claims, checked per family and concept variant (booleans plus the numbers)."""
    def trend(fam, var, m):
        return next((t for t in trends if t["family"] == fam and t["variant"] == var and t["metric"] == m), None)

    def flat(t):
        return t is not None and t["slope_se"] is not None and abs(t["slope_per_decade_N"]) <= 2 * t["slope_se"]

    out = {}
    for c in comparisons:
        fam, var = c["family"], c["variant"]
        auc, tc, hs, pg = (trend(fam, var, m) for m in ("concept_auc", "token_control", "hsic_rbf", "probing_gap"))
        taxes = list(c["tax_per_size"].values())
        out[f"{fam}/{var}"] = {
            "parallel_power_laws": not c["exponents_differ"],
            "tax_first_last": [taxes[0], taxes[-1]] if taxes else None,
            "concept_auc_flat": flat(auc), "token_control_flat": flat(tc),
            "hsic_improves_with_size": hs is not None and hs["slope_per_decade_N"] < 0
            and (hs["slope_se"] is None or hs["slope_per_decade_N"] < -2 * hs["slope_se"]),
            "probing_gap_positive": pg is not None and pg["mean"] > 0,
        }
    return out


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


def parameter_counts(model) -> dict:
    """N (non-embedding backbone: layers + final norm), embedding, concept module, total."""
    groups = {"backbone": 0, "embedding": 0, "concept": 0}
    for name, p in model.net.named_parameters():
        key = "embedding" if name == "tok_emb" else "concept" if name.split(".")[0] in (
            "known_head", "unknown_head") else "backbone"
        groups[key] += p.numel()
    total = sum(groups.values())
    return {"N": groups["backbone"], "N_embedding": groups["embedding"], "N_concept": groups["concept"],
            "N_total": total, "param_overhead": groups["concept"] / (groups["backbone"] + groups["embedding"])}


def run_config(family: str, variant: str, size: str, seed: int, steps: int, mode: dict, data: str):
    from penrose_zoo.steerling.train import TrainConfig

    s = SIZES[size]
    e = s["n_embd"]
    v = dict(VARIANTS[variant])
    tf = v.pop("teacher_forcing", 0.0)
    return TrainConfig(
        preset="small", data=data, variant=family, steps=steps, seed=seed, max_chunks=mode["max_chunks"],
        seq_len=mode["seq_len"], batch_size=mode["batch_size"], lr=3e-3, warmup=max(steps // 20, 2),
        model_overrides=dict(s, block_size=mode["seq_len"], diff_block_size=min(16, mode["seq_len"])),
        concept_overrides=dict(n_unknown_concepts=2 * e, factorize_rank=max(e // 4, 2), unknown_topk=8, topk_known=4),
        teacher_forcing_steps=round(tf * steps), **v)


def train_one(cfg, corpus, tok, train_data, val_data, *, device: str = "cpu", bf16: bool = False,
              eval_batches: int = 16) -> dict:
    """Train cfg's model in memory (train.py's batches, schedule and loss) and evaluate it."""
    import torch

    from penrose.errors import PenroseError
    from penrose_zoo.steerling.train import (TrainForward, batch_loss, batch_of, evaluate_model, lr_at, make_model,
                                             train_rows)

    cfg = cfg.resolved()
    t0 = time.time()
    model = make_model(cfg, corpus.n_concepts, tok.vocab_size, tok.mask_id).to(device)
    counts = parameter_counts(model)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    fwd = TrainForward(model, cfg.unknown_detach, cfg.lambda_bottleneck > 0)  # train's loss path, one process
    model.train()
    last = {}
    for step in range(cfg.steps):
        batch = batch_of(train_data, train_rows(train_data.n_rows, cfg.batch_size, cfg.seed, step))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=bf16):
            loss, last = batch_loss(fwd, batch, cfg, step=step, noise_seed=cfg.seed * 1_000_003 + step,
                                    device=device)
        if not math.isfinite(last["total"]):
            raise PenroseError(f"step {step}: the loss is {last['total']} ({last})")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
    train_s = time.time() - t0
    ev = evaluate_model(model, cfg, train_data, val_data, corpus.concept_names, max_batches=eval_batches,
                        steering_concepts=0, device=device)
    D = cfg.steps * cfg.batch_size * cfg.seq_len
    keep = ("val_loss", "concept_auc", "token_control", "hsic_linear", "hsic_rbf", "probe_auc_concept",
            "probe_auc_residual", "probing_gap", "logit_share_concept", "logit_share_known", "attribution_error")
    return {**counts, "D": D, "C": 6.0 * counts["N"] * D, "steps": cfg.steps,
            **{k: ev[k] for k in keep}, "train_token_loss_last": last.get("token"),
            "train_seconds": train_s, "seconds": time.time() - t0}


def run(mode_name: str, out: str | Path, *, data: str = "fortunes", device: str = "cpu", bf16: bool | None = None,
        families=FAMILIES, variants=DEFAULT_VARIANTS, seeds=None, log=None, analyse_only: bool = False) -> dict:
    """Every run of a mode (rows cached in OUT/runs), the analysis and the plots; returns results.
    results.json is rewritten after each run (plots at the end); analyse_only: train nothing,
    analyse the cached runs of these settings."""
    from penrose.io import atomic_write_text
    from penrose_zoo.steerling.train import load_corpus, make_tokenizer, packed

    log = log or (lambda m: print(m, file=sys.stderr))
    mode = dict(MODES[mode_name])
    seeds = tuple(mode["seeds"] if seeds is None else seeds)
    bf16 = (device.startswith("cuda")) if bf16 is None else bf16
    out = Path(out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    rows, cache = [], {}
    for seed in seeds:
        for family in families:
            for size, steps in mode["sizes"].items():
                for variant in variants:
                    cfg = run_config(family, variant, size, seed, steps, mode, data)
                    key = f"{family}-{variant}-{size}-s{seed}"
                    path = out / "runs" / f"{key}.json"
                    setting = {"config": dataclasses.asdict(cfg), "device": device, "bf16": bf16,
                               "eval_batches": mode["eval_batches"]}
                    if path.is_file():
                        saved = json.loads(path.read_text())
                        if saved.get("setting") == json.loads(json.dumps(setting)):
                            rows.append(saved["row"])
                            continue
                    if analyse_only:
                        continue
                    if seed not in cache:  # corpus, tokenizer and packing depend on the seed only
                        rc = cfg.resolved()
                        corpus = load_corpus(rc)
                        tok = make_tokenizer(rc, corpus)
                        cache = {seed: (corpus, tok, *packed(rc, corpus, tok))}
                    corpus, tok, tr, va = cache[seed]
                    r = train_one(cfg, corpus, tok, tr, va, device=device, bf16=bf16,
                                  eval_batches=mode["eval_batches"])
                    row = {"family": family, "variant": variant, "size": size, "seed": seed, **r}
                    atomic_write_text(path, json.dumps({"setting": setting, "row": row}, indent=1) + "\n")
                    rows.append(row)
                    _write(out, mode_name, mode, data, device, bf16, seeds, families, variants, rows, t0)
                    log(f"{key}: N {r['N']:,}  D {r['D']:,}  val {r['val_loss']:.4f}  "
                        f"auc {r['concept_auc'] if r['concept_auc'] is None else round(r['concept_auc'], 3)}  "
                        f"{r['seconds']:.0f}s  (total {time.time() - t0:.0f}s)")
    results = _write(out, mode_name, mode, data, device, bf16, seeds, families, variants, rows, t0)
    plots(results, out)
    return results


def _write(out, mode_name, mode, data, device, bf16, seeds, families, variants, rows, t0) -> dict:
    import torch

    res = analyse(rows)
    results = {"format": FORMAT, "version": 1,
               "config": {"mode": mode_name, "data": data, "device": device, "bf16": bf16, "seeds": list(seeds),
                          "sizes": {s: dict(SIZES[s], steps=n) for s, n in mode["sizes"].items()},
                          "families": list(families), "variants": {v: VARIANTS[v] for v in variants},
                          "batch_size": mode["batch_size"], "seq_len": mode["seq_len"],
                          "eval_batches": mode["eval_batches"], "torch_threads": torch.get_num_threads()},
               **res, "per_size": rows, "seconds": time.time() - t0}
    from penrose.io import atomic_write_text

    atomic_write_text(out / "results.json", json.dumps(results, indent=1, default=_json_default) + "\n")
    return results


def _json_default(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    raise TypeError(type(x).__name__)


# ---------------------------------------------------------------------------------------------
# Report: plots and tables
# ---------------------------------------------------------------------------------------------


def plots(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = [f for f in FAMILIES if any(x["family"] == f for x in results["fits"])]
    if not fams:
        return
    fig, axes = plt.subplots(1, len(fams), figsize=(6 * len(fams), 4.2), squeeze=False)
    for ax, fam in zip(axes[0], fams):
        for f in (x for x in results["fits"] if x["family"] == fam):
            C = np.array([p["C"] for p in f["points"]])
            L = np.array([p["val_loss"] for p in f["points"]])
            line = ax.loglog(C, L, "o", alpha=0.7)[0]
            xs = np.geomspace(C.min(), C.max(), 20)
            ax.loglog(xs, 10 ** (f["a"] + f["b"] * np.log10(xs)), "-", color=line.get_color(),
                      label=f"{f['variant']}: b = {f['b']:.3f} ± {f['b_std']:.3f}")
        ax.set_xlabel("compute C = 6·N·D (FLOPs)")
        ax.set_ylabel("validation token loss (nats)")
        ax.set_title(f"{fam}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "loss_vs_compute.png", dpi=110)
    plt.close(fig)

    rows = results["per_size"]
    fig, axes = plt.subplots(len(fams), len(METRICS), figsize=(3.2 * len(METRICS), 3 * len(fams)), squeeze=False)
    for i, fam in enumerate(fams):
        for j, m in enumerate(METRICS):
            ax = axes[i][j]
            for v in results["config"]["variants"]:
                pts = sorted((r["N"], r[m]) for r in rows if r["family"] == fam and r["variant"] == v
                             and r.get(m) is not None)
                if not pts:
                    continue
                N = sorted({p[0] for p in pts})
                mean = [np.mean([p[1] for p in pts if p[0] == n]) for n in N]
                ax.plot(N, mean, "o-", label=v)
            ax.set_xscale("log")
            if m.startswith("hsic"):
                ax.set_yscale("symlog", linthresh=1e-6)
            ax.set_title(f"{fam}: {m}", fontsize=9)
            ax.set_xlabel("N (non-embedding)", fontsize=8)
            if i == 0 and m == "token_control":
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "metrics_vs_size.png", dpi=110)
    plt.close(fig)


def tables(results: dict) -> str:
    lines = ["| family | variant | a | b | b_std | r² | offset vs base (log10) | loss ratio | exponents differ |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    comp = {(c["family"], c["variant"]): c for c in results["comparisons"]}
    for f in results["fits"]:
        c = comp.get((f["family"], f["variant"]))
        lines.append(f"| {f['family']} | {f['variant']} | {f['a']:.3f} | {f['b']:.4f} | {f['b_std']:.4f} "
                     f"({f['b_std_source']}) | {f['r2']:.3f} | "
                     + (f"{c['offset_log10_loss']:+.4f} | {c['loss_ratio']:.3f} | {'yes' if c['exponents_differ'] else 'no'} |"
                        if c else "— | — | — |"))
    lines += ["", "| family | variant | size | N | D | val loss | concept AUC | token ctrl | HSIC lin | HSIC rbf | "
              "probe gap | overhead |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def fmt(x, spec):
        return "n/a" if x is None else format(x, spec)

    groups: dict[tuple, list[dict]] = {}
    for r in results["per_size"]:
        groups.setdefault((r["family"], r["variant"], r["N"], r["size"]), []).append(r)
    for (fam, var, N, size), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], list(VARIANTS).index(kv[0][1]), kv[0][2])):
        def mean(k):
            v = [r[k] for r in rs if r.get(k) is not None]
            return float(np.mean(v)) if v else None
        lines.append(f"| {fam} | {var} | {size} | {N:,} | {rs[0]['D']:,} | {fmt(mean('val_loss'), '.4f')} | "
                     f"{fmt(mean('concept_auc'), '.3f')} | {fmt(mean('token_control'), '.3f')} | "
                     f"{fmt(mean('hsic_linear'), '.2e')} | {fmt(mean('hsic_rbf'), '.2e')} | "
                     f"{fmt(mean('probing_gap'), '+.3f')} | {fmt(mean('param_overhead'), '.3f')} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def add_arguments(p) -> None:
    from penrose_zoo.validate import COUNT, SEEDS, cli_device

    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="3 sizes, 1 seed (under 10 minutes on 2 cores)")
    g.add_argument("--tiny", action="store_true", help="2 tiny sizes, a few steps (a smoke test)")
    p.add_argument("--out", required=True, help="folder for results.json, the plots and the run cache")
    p.add_argument("--data", default="fortunes", help="'fortunes' or a directory of category files")
    p.add_argument("--device", type=cli_device, default="cpu", help="cpu (default) or cuda (bf16 autocast, the larger sizes)")
    p.add_argument("--no-bf16", action="store_true", help="with --device cuda: train in float32")
    p.add_argument("--families", default=",".join(FAMILIES), help="comma-separated: causal,block_causal")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help="comma-separated variants (base is needed "
                   f"for the comparisons; default {','.join(DEFAULT_VARIANTS)}; all: {','.join(VARIANTS)})")
    p.add_argument("--seeds", type=SEEDS, default=None, help="comma-separated seeds (default: the mode's)")
    p.add_argument("--threads", type=COUNT, default=1, help="torch.set_num_threads (1 is fastest on 2 cores)")
    p.add_argument("--json", action="store_true", help="print results.json instead of the tables")
    p.add_argument("--analyse-only", action="store_true", help="train nothing: analyse the runs cached in --out")


def run_args(a) -> int:
    import torch

    from penrose.errors import PenroseError

    torch.set_num_threads(a.threads)
    mode = "tiny" if a.tiny else "quick" if a.quick else "cuda" if a.device.startswith("cuda") else "default"
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise PenroseError("--device cuda: no CUDA device visible")
    fams = tuple(x for x in a.families.split(",") if x)
    vars_ = tuple(x for x in a.variants.split(",") if x)
    bad = [x for x in fams if x not in FAMILIES] + [x for x in vars_ if x not in VARIANTS]
    if bad:
        raise PenroseError(f"unknown family or variant {', '.join(bad)}; families {', '.join(FAMILIES)}, "
                           f"variants {', '.join(VARIANTS)}")
    seeds = a.seeds
    res = run(mode, a.out, data=a.data, device=a.device, bf16=False if a.no_bf16 else None, families=fams,
              variants=vars_, seeds=seeds, analyse_only=a.analyse_only)
    if a.json:
        print(json.dumps(res, indent=1, default=_json_default))
    else:
        print(tables(res))
        print(f"\n{res['seconds']:.0f}s; {Path(a.out) / 'results.json'}")
    return 0
