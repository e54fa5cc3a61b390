"""Zoo models: forward+backward time of the penrose-compiled module over its hand-written reference.

    python bench/zoo.py                 # PENROSE_REDUCED=1 for a quick run; --threads N; --only NAME

For every model at realistic sizes, the compiled diagram (`model.diagram`) and the reference in
tests/references/zoo_refs.py get the same parameters and inputs; each round runs both (in
alternating order) and the median of the per-round ratios penrose / reference is printed
(target <= 1.05 on CPU), with both median times. The loss is the sum of every float output.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from common import paired_ratio, reduced, threads_note  # noqa: E402

import penrose_zoo  # noqa: E402

spec = importlib.util.spec_from_file_location("zoo_refs", ROOT / "tests" / "references" / "zoo_refs.py")
if spec is None or spec.loader is None:
    raise ImportError(f"cannot load the zoo references from {ROOT / 'tests' / 'references' / 'zoo_refs.py'}")
refs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(refs)

#: model -> (batch shape, sizes, reference function name). Sizes are typical of the papers' use:
#: CUB-like concept sets (112 concepts, 200 classes), a 512-d backbone embedding, TF-IDF width 2000.
CASES = {
    "linear": ((256,), dict(f=2000, r=2), "linear"),
    "mlp": ((256,), dict(f=784, j=512, r=10), "mlp"),
    "self_attention": ((8,), dict(t=128, e=256, h=8, d=32), "self_attention"),
    "causal_self_attention": ((8,), dict(t=128, e=256, h=8, d=32), "causal_self_attention"),
    "sparse_autoencoder": ((256,), dict(d=512, k=4096), "sparse_autoencoder"),
    "topk_sparse_autoencoder": ((256,), dict(d=512, k=4096, n_active=32), None),
    "concept_bottleneck": ((256,), dict(f=2000, k=112, r=200), "concept_bottleneck"),
    "concept_embedding": ((256,), dict(f=512, k=112, e=16, r=200), "concept_embedding_batched"),
    "prototype_concepts": ((256,), dict(f=512, p=8, k=112, r=200), "prototype_concepts"),
    "neural_additive": ((1024,), dict(f=30, i=64, j=32, r=1), "neural_additive"),
    "mixture_of_linear_models": ((256,), dict(f=512, k=112, m=8, r=200), "mixture_of_linear_models"),
}
OPTIONS = {"linear": {"task": "multiclass"}, "mlp": {"task": "multiclass"}}


def parts(name):
    """(the compiled diagram, its reference fn(params, **inputs), the shared parameters and
    buffers by name, the inputs) of a case: one set of random parameters, copied into both."""
    batch, sizes, ref_name = CASES[name]
    entry = penrose_zoo.MODELS[name]
    compile_sizes = {k: v for k, v in sizes.items() if k != "t"}
    model = entry.build(**compile_sizes, **OPTIONS.get(name, {})).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, p in model.diagram.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    params = dict(model.diagram.named_parameters()) | dict(model.diagram.named_buffers())
    full = {**entry.cls.resolved_sizes(**compile_sizes), **sizes}
    inputs = entry.cls.make_inputs(full, batch[0], g)
    ref = getattr(refs, ref_name) if ref_name else refs.reference_for(name, full)
    return model.diagram, ref, params, inputs


def loss(out):
    """The sum of every float output (the compiled module returns every diagram output, the
    reference a dict of the same ones)."""
    vals = out.values() if isinstance(out, dict) else (out if isinstance(out, tuple) else (out,))
    return sum(v.sum() for v in vals if v.is_floating_point())


def step(fn, params, inputs):
    """A closure running forward + backward of `fn(**inputs)`, the gradients of `params` cleared first."""

    def run():
        for p in params.values():
            p.grad = None
        loss(fn(**inputs)).backward()

    return run


def setup(name):
    diagram, ref, params, inputs = parts(name)
    return step(diagram, params, inputs), step(lambda **kw: ref(params, **kw), params, inputs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--only", action="append", help="benchmark only these models")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds = args.rounds or (8 if reduced() else 30)
    print(f"zoo forward+backward, penrose / hand-written (median of {rounds} paired rounds; {threads_note()})")
    print(f"{'model':<26} {'sizes':<40} {'penrose ms':>10} {'ref ms':>9} {'ratio':>6}")
    worst = 0.0
    for name in args.only or CASES:
        run_a, run_b = setup(name)
        ratio, ta, tb = paired_ratio(run_a, run_b, rounds=rounds, warmup=3)
        worst = max(worst, ratio)
        batch, sizes, _ = CASES[name]
        desc = f"b={batch[0]} " + " ".join(f"{k}={v}" for k, v in sizes.items())
        flag = "" if ratio <= 1.05 else "  > 1.05"
        print(f"{name:<26} {desc:<40} {ta * 1e3:10.2f} {tb * 1e3:9.2f} {ratio:6.3f}{flag}", flush=True)
    print(f"worst ratio {worst:.3f} (target <= 1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
