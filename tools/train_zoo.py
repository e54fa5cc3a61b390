"""Train every zoo model on real offline data and print the results table of docs/zoo.md.

    python tools/train_zoo.py                      # all recipes, full settings (a few minutes on CPU)
    python tools/train_zoo.py --quick              # the tests' tiny runs
    python tools/train_zoo.py --only neural_additive --plots plots/

Each recipe (zoo/recipes.py) builds the model from its diagram, trains it with penrose_zoo.train.fit
and reports validation metrics; --plots DIR also writes the NAM shape functions and the concept
activations of one validation example per concept model (matplotlib).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from penrose_zoo.recipes import RECIPES, run  # noqa: E402

KEYS = [
    ("val_acc", "acc"), ("val_auc", "AUC"), ("majority_baseline", "majority"),
    ("val_concept_auc", "concept AUC"), ("val_acc_all_concepts_set", "acc, all concepts set"),
    ("val_r2", "R²"), ("val_mse", "MSE"), ("zero_baseline_mse", "MSE of train mean"),
    ("val_explained_variance", "explained var"), ("val_mean_l0", "L0"), ("alive_features", "alive"),
]


def fmt(metrics: dict) -> str:
    return ", ".join(f"{label} {metrics[k]:.3f}" if k != "val_mean_l0" else f"{label} {metrics[k]:.1f}"
                     for k, label in KEYS if k in metrics)


def plots(result, out: Path):
    from penrose_zoo.plots import plot_concepts, plot_shape_functions
    from penrose_zoo.recipes import _fortunes, _tabular

    out.mkdir(parents=True, exist_ok=True)
    model = result.model.eval()
    name = result.name.replace("/", "-")
    if result.name == "neural_additive":
        data = _tabular("breast_cancer")
        fig = plot_shape_functions(model, data.x_val, data.feature_names, features=range(10))
        fig.savefig(out / f"{name}_shape_functions.png", dpi=110)
    elif hasattr(model, "concept_names"):
        data = _fortunes(result.settings.get("features", 2000))
        with torch.no_grad():
            e = model.explain(data.x_val[:1])
        fig = plot_concepts(e)
        fig.savefig(out / f"{name}_concepts.png", dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the tests' tiny settings")
    ap.add_argument("--only", action="append", choices=list(RECIPES), help="run only these recipes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: small models)")
    ap.add_argument("--progress", action="store_true", help="show tqdm progress bars")
    ap.add_argument("--plots", type=Path, help="write NAM shape functions and concept plots here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    print("| model | data | validation results | settings | time |")
    print("| --- | --- | --- | --- | --- |")
    for name in args.only or RECIPES:
        r = run(name, quick=args.quick, seed=args.seed, progress=args.progress)
        settings = ", ".join(f"{k}={v}" for k, v in r.settings.items())
        print(f"| {name} | {r.data} | {fmt(r.metrics)} | {settings} | {r.seconds:.0f} s |", flush=True)
        if args.plots:
            plots(r, args.plots)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s (torch {torch.__version__}, {args.threads} thread(s), seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
