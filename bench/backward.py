"""Training a concept model through its generated backward against autograd, side by side.

    python bench/backward.py                 # every covered concept model, toy and wide sizes
    python bench/backward.py --threads 2     # PENROSE_REDUCED=1: fewer rounds

For each model the same `fit` runs twice per round, once with `backward='autograd'` (a graph per
step, torch's engine) and once with `backward='generated'` (`penrose.gradients.GradientPlan`:
the diagram's forward and vector-Jacobian products planned once, no graph; the losses computed
per epoch from the kept logits), on the same data, seed and initialisation, in alternating order;
printed: the median of the per-round time ratios autograd / generated, both median times per
training step, and the largest difference of the trained parameters (float64 runs, so any
difference above rounding would be a wrong gradient).

Sizes: 'toy' is the toy concept sets' shape (7 features, 3 concepts, one task logit, batch 256,
the step is overhead: where the generated backward pays); 'wide' the zoo's default sizes (2000
features, 8 concepts, batch 256: arithmetic dominates and both take about the same time).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from common import paired_seconds, reduced, threads_note  # noqa: E402

import penrose_zoo  # noqa: E402

SIZES = {"toy": dict(f=7, k=3, r=1, task="binary"), "wide": dict(f=2000, k=8, r=2, task="multiclass")}
MODELS = {
    "cbm": lambda s: penrose_zoo.ConceptBottleneckModel(**s),
    "cbm_randint": lambda s: penrose_zoo.ConceptBottleneckModel(p_int=0.25, **s),
    "logit_cbm": lambda s: penrose_zoo.LogitConceptBottleneckModel(**s),
    "hybrid": lambda s: penrose_zoo.HybridConceptBottleneckModel(j=8, **s),
    "cem": lambda s: penrose_zoo.ConceptEmbeddingModel(e=8, p_int=0.25, **s),
    "mixture": lambda s: penrose_zoo.MixtureOfLinearModels(m=4, **s),
    "graph": lambda s: penrose_zoo.InputConceptGraphModel(concept_names=[f"c{i}" for i in range(s["k"])],
                                                     parents={"c2": ["c0", "c1"]}, **s),
}


def data(sizes: dict, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, sizes["f"], generator=g)
    c = (x[:, : sizes["k"]] > 0).float()
    y = (c.sum(-1) > sizes["k"] / 2).long() if sizes["task"] == "binary" else torch.randint(0, sizes["r"], (n,), generator=g)
    return x, c, y


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rounds = 3 if reduced() else 9
    epochs = {"toy": 5 if reduced() else 20, "wide": 1 if reduced() else 3}
    rows = 2100
    print(f"generated backward vs autograd, concept models' fit: {rows} rows, batch 256, Adam; {threads_note()}")
    print(f"{'size':<5} {'model':<12} {'autograd/generated':>18} {'autograd µs/step':>17} {'generated µs/step':>18} {'max param diff (f64)':>21}")
    ratios = {s: [] for s in args.sizes}
    for size in args.sizes:
        sizes = SIZES[size]
        x, c, y = data(sizes, rows)
        steps = epochs[size] * -(-rows // 256)
        for name in args.models:
            def run(backward: str, dtype=torch.float32) -> tuple[torch.nn.Module, float]:
                """A fresh model (built untimed), then its fit, timed (planning included)."""
                model = MODELS[name](dict(sizes, seed=0)).to(dtype)
                xs, cs = x.to(dtype), c.to(dtype)
                t0 = time.perf_counter()
                model.fit((xs, cs, y), epochs=epochs[size], batch_size=256, lr=1e-2, seed=0, progress=False,
                          backward=backward)
                return model, time.perf_counter() - t0

            ratio, ta, tg = paired_seconds(lambda: run("autograd")[1], lambda: run("generated")[1], rounds, warmup=1)
            a, g = run("autograd", torch.float64)[0], run("generated", torch.float64)[0]
            with torch.no_grad():
                diff = max(float((p - q).abs().max()) for p, q in zip(a.parameters(), g.parameters()))
            ratios[size].append(ratio)
            print(f"{size:<5} {name:<12} {ratio:17.2f}× {ta / steps * 1e6:17.0f} {tg / steps * 1e6:18.0f} {diff:21.1e}", flush=True)
    for size, rs in ratios.items():
        if rs:
            rs = sorted(rs)
            print(f"{size}: autograd / generated, min {rs[0]:.2f}×, median {rs[len(rs) // 2]:.2f}×")
    return 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    code = main()
    print(f"({time.perf_counter() - t0:.0f} s)")
    sys.exit(code)
