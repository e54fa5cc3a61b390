"""Peak memory of Steerling's concept module on CPU: the model's path (heads blocked) vs dense.

    python bench/steerling_memory.py                       # T = 4096, release concept sizes (needs ~12 GB)
    python bench/steerling_memory.py --tokens 1024         # smaller

Each mode runs in a fresh subprocess: a `Steerling` with the release's concept sizes (33,732
known and 101,196 unknown concepts, rank 256, width 4096, top 32 / 128, blocks of 4096 concepts,
large-concept threshold 50,000) and a token-sized backbone (one layer, vocabulary 256 — the
backbone never runs) is built, a hidden state of T tokens is drawn, the peak-RSS counter is reset,
and everything `Steerling.forward` computes after the hidden state runs once under no_grad
(`Steerling.concepts_from_hidden`: both heads, ε, the LM head); the growth of the peak RSS over
the set-up is reported:

  model    what Steerling.forward runs: both heads blocked (zoo/steerling/blocked.py), each wider
           than one block of 4,096 concepts — the known head (33,732 ≤ 50,000) with the release's
           small-head rules, the unknown head (101,196 > 50,000) with its large-head rules
  dense    dense_heads=True: both heads by their diagrams, (T × n) logits and weights per head,
           as the compiled steerling.pen computes them

Both produce the same features and top-k lists (checked here on the first 64 tokens).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _child(mode: str, tokens: int, width: int) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    from penrose_zoo.steerling import Steerling

    torch.manual_seed(0)
    model = Steerling.from_release_config(
        {"n_layers": 1, "n_embd": width, "n_head": max(4, width // 128), "intermediate_size": 8},
        {"concept_dim": width}, 256, seed=0).eval()
    model.requires_grad_(False)
    assert not model.known_large and model.unknown_large
    g = torch.Generator().manual_seed(0)
    h = torch.randn(1, tokens, width, generator=g)
    if mode == "check":
        with torch.no_grad():
            a = model.concepts_from_hidden(h[:, :64])
            b = model.concepts_from_hidden(h[:, :64], dense_heads=True)
        same_ids = all(bool(torch.equal(getattr(a, f).sort(-1).values, getattr(b, f).sort(-1).values))
                       for f in ("known_topk_indices", "unknown_topk_indices"))
        return {"max_diff": max(float((a.composed - b.composed).abs().max()),
                                float((a.known_features - b.known_features).abs().max()),
                                float((a.unknown_features - b.unknown_features).abs().max())),
                "same_unknown_topk": same_ids}
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS counter
        base = _rss_kib("VmHWM")
    except OSError:
        base = _rss_kib("VmRSS")
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.concepts_from_hidden(h, dense_heads=mode == "dense")
    seconds = time.perf_counter() - t0
    peak = _rss_kib("VmHWM")
    return {"mode": mode, "tokens": tokens, "peak_growth_mib": (peak - base) / 1024, "seconds": seconds,
            "z_norm": float(out.composed.norm()), "known_dense": out.known_weights is not None,
            "unknown_dense": out.unknown_weights is not None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--width", type=int, default=4096, help="n_embd = concept_dim (release: 4096)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.tokens, args.width)))
        return 0
    results = {}
    for mode in ("check", "dense", "model"):
        cmd = [sys.executable, __file__, "--child", mode, "--tokens", str(args.tokens), "--width", str(args.width)]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            print(f"{mode}: failed\n{run.stderr[-2000:]}")
            return 1
        results[mode] = json.loads(run.stdout.strip().splitlines()[-1])
    d, m, c = results["dense"], results["model"], results["check"]
    print(f"Steerling concept module after h, T = {args.tokens}, width {args.width}, release concept sizes, CPU, no_grad")
    print(f"  dense (dense_heads=True)           : peak +{d['peak_growth_mib']:8.0f} MiB, {d['seconds']:.1f} s")
    print(f"  model (Steerling.forward's path)   : peak +{m['peak_growth_mib']:8.0f} MiB, {m['seconds']:.1f} s"
          f"  (blocked: known {not m['known_dense']}, unknown {not m['unknown_dense']})")
    print(f"  ratio dense / model: {d['peak_growth_mib'] / max(m['peak_growth_mib'], 1e-9):.1f}x; same outputs: "
          f"max diff {c['max_diff']:.1e}, same top-k {c['same_unknown_topk']} (first 64 tokens)")
    return 0 if c["max_diff"] <= 1e-4 and c["same_unknown_topk"] else 1  # the two paths disagree


if __name__ == "__main__":
    sys.exit(main())
