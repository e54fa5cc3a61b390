"""Zoo models under torch.compile: the compiled diagram beside its hand-written reference, both compiled.

    python bench/compile_zoo.py         # PENROSE_REDUCED=1 for a quick run; --only NAME; --backend eager

For each case of bench/zoo.py (its sizes, its references from tests/references/zoo_refs.py, one
set of parameters shared by both sides), forward + backward of `torch.compile(model.diagram)` and
of `torch.compile(reference)` (inductor, default mode, unless --backend) run in alternating
order; the median of the per-round ratios penrose / reference is printed beside the eager pair's
(penrose / reference, uncompiled), with the median times and each side's first call (the
compilation). Before timing, both compiled sides must give the eager loss: the script exits 1
when they do not.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import paired_ratio, reduced, threads_note  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_zoo", HERE / "zoo.py")
if _spec is None or _spec.loader is None:
    raise ImportError(f"cannot load {HERE / 'zoo.py'}")
bench_zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_zoo)


def _first_call(run) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def _same_loss(a, b, inputs) -> bool:
    with torch.no_grad():
        la, lb = bench_zoo.loss(a(**inputs)), bench_zoo.loss(b(**inputs))
    return bool(torch.allclose(la, lb, rtol=1e-4, atol=1e-4 * max(1.0, float(lb.abs()))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--only", action="append", help="benchmark only these models")
    ap.add_argument("--backend", default="inductor", help="torch.compile's backend (default inductor)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds = args.rounds or (5 if reduced() else 20)
    print(f"zoo forward+backward under torch.compile (backend {args.backend}, default mode), penrose / hand-written; "
          f"median of {rounds} paired rounds; {threads_note()}")
    print(f"{'model':<26} {'compiled ms':>11} {'ref ms':>8} {'ratio':>6}   {'eager ratio':>11}   {'compile s':>9} {'ref s':>6}")
    ratios, bad = [], []
    for name in args.only or bench_zoo.CASES:
        torch._dynamo.reset()  # each case compiles afresh: its first call is its own compilation
        diagram, ref, params, inputs = bench_zoo.parts(name)
        compiled = torch.compile(diagram, backend=args.backend)
        compiled_ref = torch.compile(ref, backend=args.backend)

        def reference(**kw):
            return ref(params, **kw)

        def compiled_reference(**kw):
            return compiled_ref(params, **kw)

        pen, href = bench_zoo.step(compiled, params, inputs), bench_zoo.step(compiled_reference, params, inputs)
        first_pen, first_ref = _first_call(pen), _first_call(href)
        if not (_same_loss(compiled, diagram, inputs) and _same_loss(compiled_reference, reference, inputs)
                and _same_loss(diagram, reference, inputs)):
            bad.append(name)
        ratio, ta, tb = paired_ratio(pen, href, rounds=rounds, warmup=2)
        eager, _, _ = paired_ratio(bench_zoo.step(diagram, params, inputs), bench_zoo.step(reference, params, inputs),
                                   rounds=rounds, warmup=2)
        ratios.append(ratio)
        print(f"{name:<26} {ta * 1e3:11.2f} {tb * 1e3:8.2f} {ratio:6.3f}   {eager:11.3f}   {first_pen:9.1f} {first_ref:6.1f}",
              flush=True)
    print(f"median ratio {statistics.median(ratios):.3f} (compiled penrose / compiled reference), worst {max(ratios):.3f}")
    if bad:
        print(f"FAIL: compiled and eager losses differ for {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
