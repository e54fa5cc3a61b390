"""The base-vs-concept-module experiment of docs/experiments.md, in one command:

    python -m penrose_zoo.steerling.experiment [--steps 1500] [--out build/experiment]
                                               [--figures docs/figures/experiments]

Two models with the same backbone (preset `small`), data (fortunes), seed and steps:
  base     ε on and every concept loss at λ = 0: the LM head reads h, so this is a plain LM
           (the concept heads are carried along untrained; they do not touch the logits);
  concept  the pure bottleneck of the post (ε off: the head reads k̂ + û) with the concept,
           independence and reconstruction losses (λ = 0.1, 1, 0.1).
Each is trained (resumable: rerunning continues), evaluated with penrose_zoo.steerling.train.
evaluate_checkpoint, and the results go to FIGURES/results.json, FIGURES/val_loss.png and
FIGURES/metrics.png; a markdown table is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

RUNS = {
    "base": dict(epsilon=True, lambda_concept=0.0, lambda_indep=0.0, lambda_rec=0.0),
    "concept": dict(epsilon=False, lambda_concept=0.1, lambda_indep=1.0, lambda_rec=0.1),
}
METRICS = ("val_loss", "concept_auc", "token_control", "hsic_linear", "hsic_rbf", "probe_auc_concept",
           "probe_auc_residual", "probing_gap", "logit_share_concept", "logit_share_known",
           "steer_suppress_mean", "steer_boost_mean", "attribution_error")


def main(argv=None) -> int:
    import torch

    from penrose_zoo.steerling.train import TrainConfig, evaluate_checkpoint, train

    from penrose_zoo.validate import COUNT, NONNEGATIVE, SEED

    p = argparse.ArgumentParser(prog="python -m penrose_zoo.steerling.experiment")
    p.add_argument("--steps", type=COUNT, default=1500)
    p.add_argument("--preset", default="small")
    p.add_argument("--max-chunks", type=NONNEGATIVE, default=0)
    p.add_argument("--out", default="build/experiment")
    p.add_argument("--figures", default="docs/figures/experiments")
    p.add_argument("--threads", type=COUNT, default=1)
    p.add_argument("--seed", type=SEED, default=0)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    figs = Path(a.figures)
    figs.mkdir(parents=True, exist_ok=True)
    results, histories, t0 = {}, {}, time.time()
    for name, opts in RUNS.items():
        cfg = TrainConfig(preset=a.preset, data="fortunes", steps=a.steps, seed=a.seed, max_chunks=a.max_chunks, **opts)
        t = time.time()
        state = train(cfg, Path(a.out) / name, val_every=max(a.steps // 10, 1), save_every=max(a.steps // 4, 1),
                      progress=False)
        histories[name] = state["history"]
        results[name] = evaluate_checkpoint(Path(a.out) / name)
        results[name]["seconds"] = time.time() - t
        print(f"{name}: {results[name]['seconds']:.0f}s  val loss {results[name]['val_loss']:.4f}", file=sys.stderr)
    results["tax"] = results["concept"]["val_loss"] - results["base"]["val_loss"]
    results["config"] = {"steps": a.steps, "preset": a.preset, "seed": a.seed, "max_chunks": a.max_chunks,
                         "runs": RUNS, "total_seconds": time.time() - t0}
    (figs / "results.json").write_text(json.dumps({"results": results, "history": histories}, indent=1) + "\n")
    _plots(results, histories, figs)
    print(table(results))
    return 0


def table(results: dict) -> str:
    rows = ["| metric | base | concept |", "| --- | --- | --- |"]
    for m in METRICS:
        vals = [results[r].get(m) for r in ("base", "concept")]
        rows.append(f"| {m} | " + " | ".join("n/a" if v is None else f"{v:.4g}" for v in vals) + " |")
    rows.append(f"| tax (Δ val loss) | | {results['tax']:+.4f} |")
    return "\n".join(rows)


def _plots(results, histories, figs: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, h in histories.items():
        ax.plot([r["step"] for r in h["train"]], [r["token"] for r in h["train"]], alpha=0.3, label=f"{name} train")
        ax.plot([r["step"] for r in h["val"]], [r["token"] for r in h["val"]], marker="o", label=f"{name} val")
    ax.set_xlabel("step")
    ax.set_ylabel("token loss (nats)")
    ax.set_title("token loss: base vs concept module")
    ax.legend()
    fig.tight_layout()
    fig.savefig(figs / "val_loss.png", dpi=110)
    plt.close(fig)

    ms = [m for m in METRICS if m not in ("val_loss", "attribution_error")]
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, name in enumerate(("base", "concept")):
        vals = [results[name].get(m) or 0.0 for m in ms]
        ax.bar([j + 0.4 * i for j in range(len(ms))], vals, width=0.4, label=name)
    ax.set_xticks([j + 0.2 for j in range(len(ms))], ms, rotation=40, ha="right", fontsize=8)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_title("interpretability metrics (validation)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(figs / "metrics.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
