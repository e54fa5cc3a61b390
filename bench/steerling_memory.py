"""Peak memory of Steerling's concept module on CPU: the dense diagram vs the blocked top-k path.

    python bench/steerling_memory.py                       # T = 4096, release concept sizes (needs ~16 GB)
    python bench/steerling_memory.py --tokens 1024         # smaller

Each mode runs in a fresh subprocess: the concept module's parameters (release sizes: 33,732
known and 101,196 unknown concepts, rank 256, width 4096, top 32 / 128) and a hidden state of
T tokens are set up, the peak-RSS counter is reset, one forward pass runs under no_grad, and the
growth of the peak RSS over the set-up is reported:

  dense    the compiled diagram zoo/steerling/concept_module.pen (dense logits and weights,
           (T × n) per head, as the diagrams draw them)
  blocked  zoo/steerling/blocked.py, the same parameters in blocks of concepts
           (no (T × n) matrix; top-k ids, features and ε only)

Both produce the same features (checked here on the first 64 tokens).
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


def _child(mode: str, tokens: int, width: int, block: int) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    import penrose
    from zoo.steerling.blocked import concept_module_blocked
    from zoo.steerling.model import diagram_sizes

    torch.set_num_threads(max(1, torch.get_num_threads()))
    sizes = diagram_sizes({"n_embd": width, "n_head": max(1, width // 128)}, {"concept_dim": width}, 100281)
    names = ("e", "pm", "c", "kc", "u", "j", "ku")
    net = penrose.compile(ROOT / "zoo" / "steerling" / "concept_module.pen", seed=0, **{k: sizes[k] for k in names})
    net.requires_grad_(False)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(1, tokens, width, generator=g)
    inputs = dict(kpos=torch.ones(1, tokens, dtype=torch.bool), ksel=torch.zeros(sizes["c"], dtype=torch.bool),
                  kval=torch.zeros(sizes["c"]), upos=torch.ones(1, tokens, dtype=torch.bool),
                  usel=torch.zeros(sizes["u"], dtype=torch.bool), uval=torch.zeros(sizes["u"]))
    if mode == "check":
        with torch.no_grad():
            d = net(h=h[:, :64], **{k: v[:, :64] if k.endswith("pos") else v for k, v in inputs.items()},
                    use_eps=torch.tensor(True))
            b = concept_module_blocked(net, h[:, :64], **{k: v[:, :64] if k.endswith("pos") else v for k, v in inputs.items()},
                                       use_eps=True, sizes=sizes, block=block)
        return {"max_diff": max(float((d.z - b["z"]).abs().max()), float((d.kf - b["kf"]).abs().max()),
                                float((d.uf - b["uf"]).abs().max()))}
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS counter
        base = _rss_kib("VmHWM")
    except OSError:
        base = _rss_kib("VmRSS")
    t0 = time.perf_counter()
    with torch.no_grad():
        if mode == "dense":
            out = net(h=h, **inputs, use_eps=torch.tensor(True))
            z = out.z
        else:
            z = concept_module_blocked(net, h, **inputs, use_eps=True, sizes=sizes, block=block)["z"]
    seconds = time.perf_counter() - t0
    peak = _rss_kib("VmHWM")
    return {"mode": mode, "tokens": tokens, "peak_growth_mib": (peak - base) / 1024, "seconds": seconds,
            "z_norm": float(z.norm())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--width", type=int, default=4096, help="n_embd = concept_dim (release: 4096)")
    ap.add_argument("--block", type=int, default=4096, help="concepts per block in the blocked path")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.tokens, args.width, args.block)))
        return 0
    results = {}
    for mode in ("check", "dense", "blocked"):
        cmd = [sys.executable, __file__, "--child", mode, "--tokens", str(args.tokens), "--width", str(args.width),
               "--block", str(args.block)]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            print(f"{mode}: failed\n{run.stderr[-2000:]}")
            return 1
        results[mode] = json.loads(run.stdout.strip().splitlines()[-1])
    d, b = results["dense"], results["blocked"]
    print(f"Steerling concept module, T = {args.tokens}, width {args.width}, release concept sizes, CPU, no_grad")
    print(f"  dense   (concept_module.pen): peak +{d['peak_growth_mib']:8.0f} MiB, {d['seconds']:.2f} s")
    print(f"  blocked (block {args.block}):        peak +{b['peak_growth_mib']:8.0f} MiB, {b['seconds']:.2f} s")
    print(f"  ratio dense / blocked: {d['peak_growth_mib'] / max(b['peak_growth_mib'], 1e-9):.1f}x; "
          f"same outputs: max diff {results['check']['max_diff']:.1e} (first 64 tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
