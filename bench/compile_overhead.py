"""Compiled diagram vs hand-written torch: forward+backward time ratios, and compile latency.

    python bench/compile_overhead.py          # PENROSE_REDUCED=1 for a quick run

Prints, for self-attention, an MLP and a concept bottleneck at realistic sizes, the median of
paired-run ratios (penrose / hand-written; target <= 1.05 on CPU), then the time to parse,
check and compile zoo/paper/steerling_listing.pen (target < 50 ms).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import fwd_bwd, paired_ratio, reduced, threads_note  # noqa: E402

import penrose  # noqa: E402
from penrose.compiler import build  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

SELF_ATTENTION = """
dim t = 256, p = 256, d = 512, e = 64
input Z[t, d]
param W_q[d, e]
param W_k[d, e]
param W_v[d, e]
q = einsum('td,de->te', Z, W_q)
k = einsum('pd,de->pe', Z, W_k)
v = einsum('pd,de->pe', Z, W_v)
l = einsum('te,pe->tp', q, k) / sqrt(e)
probs = softmax(l, dim=-1)
h = einsum('tp,pe->te', probs, v)
output h
"""

MLP = """
dim j = 512, i = 1024, o = 256
input X[j]
param W0[i, j]
param W1[i, i]
param W2[o, i]
z1 = sigma(einsum('bj,ij->bi', X, W0))
z2 = sigma(einsum('bj,ij->bi', z1, W1))
y = sigma(einsum('bj,ij->bi', z2, W2))
output y
"""

CONCEPT_BOTTLENECK = """
dim d = 768, k = 112, r = 200
input z[d]
param W[d, k]
param V[k, r]
c = sigma(einsum('d,dk->k', z, W))
y = einsum('k,kr->r', c, V)
output c, y
"""


class HandAttention(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.W_q, self.W_k, self.W_v = m.W_q, m.W_k, m.W_v

    def forward(self, Z):
        q, k, v = Z @ self.W_q, Z @ self.W_k, Z @ self.W_v
        probs = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        return probs @ v


class HandMLP(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.W0, self.W1, self.W2 = m.W0, m.W1, m.W2

    def forward(self, X):
        z = torch.sigmoid(torch.nn.functional.linear(X, self.W0))
        z = torch.sigmoid(torch.nn.functional.linear(z, self.W1))
        return torch.sigmoid(torch.nn.functional.linear(z, self.W2))


class HandCBM(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.W, self.V = m.W, m.V

    def forward(self, z):
        c = torch.sigmoid(z @ self.W)
        return c, c @ self.V


def _patch_mlp_batch(text: str) -> str:
    # the paper's MLP reads X as 'bj': the batch leg b is an explicit leg here
    return text.replace("dim j = 512", "dim b = 64, j = 512").replace("input X[j]", "input X[b, j]")


def main():
    rounds = 10 if reduced() else 40
    cases = [
        ("self-attention t=256 d=512 e=64 batch 8", SELF_ATTENTION, HandAttention, {"Z": torch.randn(8, 256, 512)}),
        ("MLP 512-1024-1024-256 batch 64", _patch_mlp_batch(MLP), HandMLP, {"X": torch.randn(64, 512)}),
        ("concept bottleneck d=768 k=112 r=200 batch 256", CONCEPT_BOTTLENECK, HandCBM, {"z": torch.randn(256, 768)}),
    ]
    print(f"penrose vs hand-written torch, forward+backward ({threads_note()}, {rounds} paired rounds)")
    print(f"{'model':<50} {'penrose ms':>11} {'hand ms':>9} {'ratio':>7}")
    for name, text, Hand, inputs in cases:
        torch.manual_seed(0)
        m = penrose.compile(text, seed=0)
        hand = Hand(m)
        with torch.no_grad():
            a, b = m(**inputs), hand(**inputs)
            a = a if isinstance(a, tuple) else (a,)
            b = b if isinstance(b, tuple) else (b,)
            err = max((x - y).abs().max().item() for x, y in zip(a, b))
        ratio, ta, tb = paired_ratio(fwd_bwd(m, inputs), fwd_bwd(hand, inputs), rounds=rounds)
        print(f"{name:<50} {ta * 1e3:>11.2f} {tb * 1e3:>9.2f} {ratio:>7.3f}   (max |diff| {err:.1e})")

    listing = ROOT / "zoo" / "paper" / "steerling_listing.pen"
    if listing.exists():
        times = {"parse": [], "check": [], "compile": []}
        for _ in range(5 if reduced() else 20):
            t0 = time.perf_counter()
            d = penrose.parse_file(listing)
            t1 = time.perf_counter()
            c = penrose.check(d)
            t2 = time.perf_counter()
            build(c)
            t3 = time.perf_counter()
            times["parse"].append(t1 - t0)
            times["check"].append(t2 - t1)
            times["compile"].append(t3 - t2)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        total = sum(med.values())
        print(
            f"\nsteerling_listing.pen: parse {med['parse']:.1f} ms + check {med['check']:.1f} ms + "
            f"compile {med['compile']:.1f} ms = {total:.1f} ms (target < 50 ms)"
        )
    else:
        print("\nzoo/paper/steerling_listing.pen not found; compile latency not measured")


if __name__ == "__main__":
    main()
