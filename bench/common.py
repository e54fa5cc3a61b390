"""Shared timing helpers for the benchmarks: paired runs, medians, ratios."""

from __future__ import annotations

import os
import statistics
import time

import torch


def reduced() -> bool:
    """PENROSE_REDUCED=1 (set by CI) asks for fewer repetitions."""
    return os.environ.get("PENROSE_REDUCED", "") not in ("", "0")


def time_call(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def paired_ratio(fn_a, fn_b, rounds: int = 30, warmup: int = 3) -> tuple[float, float, float]:
    """Median of per-round time ratios a/b, alternating a and b so drift hits both alike.

    Returns (median ratio, median time of a, median time of b) in seconds.
    """
    return paired_seconds(lambda: time_call(fn_a, 1)[0], lambda: time_call(fn_b, 1)[0], rounds, warmup)


def paired_seconds(a, b, rounds: int = 30, warmup: int = 3) -> tuple[float, float, float]:
    """`paired_ratio` of callables that time themselves: each returns the seconds to count (a
    benchmark that leaves its set-up out of the timing)."""
    for _ in range(warmup):
        a()
        b()
    ratios, ta, tb = [], [], []
    for i in range(rounds):
        if i % 2 == 0:
            sa = a()
            sb = b()
        else:
            sb = b()
            sa = a()
        ratios.append(sa / sb)
        ta.append(sa)
        tb.append(sb)
    return statistics.median(ratios), statistics.median(ta), statistics.median(tb)


def fwd_bwd(module, inputs: dict):
    """A closure running forward + backward of module on inputs (keyword arguments)."""

    def run():
        for p in module.parameters():
            p.grad = None
        out = module(**inputs)
        if isinstance(out, tuple):
            out = sum(o.float().sum() for o in out)
        out.float().sum().backward()

    return run


def threads_note() -> str:
    return f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
