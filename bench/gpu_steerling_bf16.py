"""Steerling on a GPU: bfloat16 parity with float32, tokens per second and peak memory.

    python bench/gpu_steerling_bf16.py                 # on a CUDA machine (bench/gpu_steerling.sh)
    python bench/gpu_steerling_bf16.py --device cpu --tiny   # a smoke run anywhere

Stated tolerance: bfloat16 keeps 8 bits of mantissa, so logits are compared relative to their
scale: max |logits_bf16 - logits_fp32| / max |logits_fp32| <= 5e-2, and the top-1 token agrees
on at least 95% of positions. The script prints both numbers and exits 1 when either fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TypedDict

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from penrose_zoo.steerling import Steerling  # noqa: E402

class Config(TypedDict):
    model: dict  # Steerling's model config
    concepts: dict  # its concept config
    vocab: int
    batch: int
    length: int


SMALL = Config(
    model=dict(n_layers=4, n_head=8, n_kv_heads=2, n_embd=512, block_size=1024, diff_block_size=64,
               intermediate_size=1536),
    concepts=dict(n_concepts=512, n_unknown_concepts=2048, concept_dim=512, factorize_rank=64,
                  topk_known=32, topk_known_features=32, unknown_topk=64),
    vocab=4096, batch=8, length=1024,
)
TINY = Config(
    model=dict(n_layers=1, n_head=2, n_kv_heads=1, n_embd=32, block_size=64, diff_block_size=8, intermediate_size=64),
    concepts=dict(n_concepts=16, n_unknown_concepts=32, concept_dim=32, factorize_rank=8, topk_known=4,
                  topk_known_features=4, unknown_topk=4),
    vocab=300, batch=2, length=32,
)
TOLERANCE = 5e-2
TOP1_AGREEMENT = 0.95


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (a smoke run)")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --tiny for a smoke run")
        return 2
    cfg = TINY if args.tiny else SMALL
    dev = torch.device(args.device)
    torch.manual_seed(0)
    with torch.device(dev):
        model = Steerling(cfg["model"], cfg["concepts"], cfg["vocab"], seed=0)
    model.eval()
    ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["length"]), device=dev)
    with torch.no_grad():
        ref = model(ids).logits.float()
        half = Steerling(cfg["model"], cfg["concepts"], cfg["vocab"]).to(dev)
        half.load_state_dict(model.state_dict())
        half = half.to(torch.bfloat16).eval()
        low = half(ids).logits.float()
    rel = ((low - ref).abs().max() / ref.abs().max()).item()
    agree = (low.argmax(-1) == ref.argmax(-1)).float().mean().item()
    ok = rel <= TOLERANCE and agree >= TOP1_AGREEMENT
    print(f"bfloat16 vs float32: max rel logit error {rel:.3e} (tolerance {TOLERANCE}), "
          f"top-1 agreement {agree:.3f} (>= {TOP1_AGREEMENT}) -> {'ok' if ok else 'FAIL'}")

    for name, m in (("float32", model), ("bfloat16", half)):
        m.train()
        params = [p for p in m.parameters() if p.requires_grad]
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.steps + 2):
            for p in params:
                p.grad = None
            t0 = time.perf_counter()
            m(ids).logits.float().logsumexp(-1).mean().backward()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        step = sorted(times[2:])[len(times[2:]) // 2]
        tokens = cfg["batch"] * cfg["length"] / step
        mem = f", peak memory {torch.cuda.max_memory_allocated() / 2**20:,.0f} MiB" if dev.type == "cuda" else ""
        print(f"{name}: forward+backward {step * 1e3:.1f} ms per step, {tokens:,.0f} tokens/s{mem}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
