"""Loading a published-layout Steerling checkpoint: peak memory over the weights, time per token.

    python bench/steerling_load.py                 # full size: 8.39 B parameters in bfloat16 (16.8 GB)
    python bench/steerling_load.py --small         # a small config (seconds; what the tests run)
    python bench/steerling_load.py --dir D --keep  # write D (or reuse it: --reuse) and keep it

1. Writes a synthetic checkpoint folder in the release's published layout: config.json (model
   fields flat, `interpretable`, `concept`, `vocab_size`, `instruct`, hub keys) and bfloat16
   random weights with the release's key names and shapes, the tied embedding stored once (as
   `transformer.lm_head.weight`), sharded into files of at most --shard-gb GB
   (`model-0000i-of-0000n.safetensors`, listed in `model.safetensors.index.json`). Tensors are
   generated and written a slice at a time, so the writer holds ~64 MB, never a shard; the folder
   goes under a temporary directory (or --dir) on a disk with room for it (checked first).
2. In a fresh process: `Steerling.from_pretrained(dir, dtype=torch.bfloat16)`, one forward pass on
   --tokens tokens, and one block of generation (--tokens prompt tokens, then one diffusion block
   of `diff_block_size` new tokens in --steps-per-block steps). It reports the peak resident set
   (VmHWM of /proc/self/status, which counts the memory-mapped weights once touched) over the
   weights' bytes, the same for the growth over the process before loading, and the times.

The loader maps the files' tensors as the parameters (no copy), so the peak is about one copy of
the weights plus the activations and the interpreter.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# ~130 M parameters (260 MB): large enough that the interpreter does not swamp the ratio
SMALL = dict(model=dict(n_layers=2, n_head=8, n_kv_heads=2, n_embd=1024, block_size=256, diff_block_size=16,
                        intermediate_size=2048),
             concept=dict(n_concepts=5000, n_unknown_concepts=12000, concept_dim=1024, factorize_rank=32,
                          topk_known=8, topk_known_features=8, unknown_topk=16, block_size=2048),
             vocab_size=100281)
FULL = dict(model={}, concept={}, vocab_size=100281)  # {} = the release's defaults (steerling-8b)
HUB = {"model_type": "steerling", "architectures": ["SteerlingForCausalLM"],
       "auto_map": {"AutoModel": "modeling_steerling.SteerlingForCausalLM"},
       "transformers_version": "4.57.1", "_name_or_path": "guidelabs/steerling-8b", "torch_dtype": "bfloat16"}
CHUNK_BYTES = 64 << 20


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def release_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """The release's keys and shapes for a config (tied embedding once, as tok_emb), in its order."""
    import torch

    from penrose_zoo.steerling import Steerling

    with torch.device("meta"):
        model = Steerling.from_release_config(cfg["model"], cfg["concept"], cfg["vocab_size"])
    return model.expected_release_shapes()


def write_checkpoint(out: Path, cfg: dict, shard_bytes: int, seed: int = 0) -> dict:
    """Write the published layout to `out`, streaming every tensor in slices (bfloat16)."""
    import torch

    shapes = release_shapes(cfg)
    names = {k: ("transformer.lm_head.weight" if k == "transformer.tok_emb.weight" else k) for k in shapes}
    shards: list[list[str]] = [[]]
    size = 0
    for k, shape in shapes.items():
        nbytes = 2 * math.prod(shape)
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(k)
        size += nbytes
    out.mkdir(parents=True, exist_ok=True)
    n = len(shards)
    files = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    g = torch.Generator().manual_seed(seed)
    total = 0
    for file, keys in zip(files, shards):
        header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for k in keys:
            nbytes = 2 * math.prod(shapes[k])
            header[names[k]] = {"dtype": "BF16", "shape": list(shapes[k]), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        with open(out / (file + ".tmp"), "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for k in keys:
                shape = shapes[k]
                if len(shape) == 1:  # norm weights: ones with a little noise
                    f.write((1 + 0.05 * torch.randn(shape, generator=g)).to(torch.bfloat16).view(torch.uint8).numpy().data)
                    continue
                rows, cols = shape
                step = max(1, CHUNK_BYTES // (4 * cols))
                scale = 1.0 / math.sqrt(cols)
                for r in range(0, rows, step):
                    part = torch.randn(min(step, rows - r), cols, generator=g).mul_(scale).to(torch.bfloat16)
                    f.write(part.view(torch.uint8).numpy().data)
            total += offset
        os.replace(out / (file + ".tmp"), out / file)
    wmap = {names[k]: file for file, keys in zip(files, shards) for k in keys}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wmap},
                                                                 indent=1))
    (out / "config.json").write_text(json.dumps({**HUB, **cfg["model"], "interpretable": True,
                                                 "concept": cfg["concept"], "vocab_size": cfg["vocab_size"],
                                                 "instruct": False}, indent=1))
    return {"bytes": total, "shards": n, "tensors": len(shapes)}


def child(directory: str, tokens: int, steps: int, threads: int | None) -> dict:
    """Load, forward, one block of generation; measured in this (fresh) process."""
    import torch

    from penrose_zoo.steerling import Steerling
    from penrose_zoo.steerling.generate import generate_block_diffusion

    if threads:
        torch.set_num_threads(threads)
    before = _status_kib("VmRSS") * 1024
    t0 = time.perf_counter()
    model = Steerling.from_pretrained(directory, dtype=torch.bfloat16).eval()
    load_s = time.perf_counter() - t0
    after_load = _status_kib("VmRSS") * 1024
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    t0 = time.perf_counter()
    with torch.no_grad():  # read one number per page of every weight: all of them resident
        for p in model.parameters():
            float(p.reshape(-1)[:: max(1, 4096 // p.element_size())].float().sum())
    touch_s = time.perf_counter() - t0
    touched = _status_kib("VmRSS") * 1024
    V = model.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, min(V, 100257), (1, tokens), generator=g)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(ids)
        forward_s = time.perf_counter() - t0
        assert torch.isfinite(out.logits.float()).all()
        del out
        blk = model.sizes["blk"]
        mask = model.mask_token_id if model.mask_token_id is not None else V - 1
        t0 = time.perf_counter()
        seq = generate_block_diffusion(model, ids[0], blk, mask_id=mask, steps_per_block=steps, temperature=0.0,
                                       generator=g)
        gen_s = time.perf_counter() - t0
    assert seq.numel() == tokens + blk and not (seq[tokens:] == mask).any()
    peak = _status_kib("VmHWM") * 1024
    return {"parameters": model.num_parameters(), "weight_bytes": weights, "rss_before_load": before,
            "rss_after_load": after_load, "rss_touched": touched, "touched_over_weights": (touched - before) / weights, "touch_s": touch_s,
            "peak_rss": peak, "peak_over_weights": peak / weights,
            "growth_over_weights": (peak - before) / weights, "load_s": load_s, "forward_tokens": tokens,
            "forward_s": forward_s, "new_tokens": blk, "steps_per_block": steps, "generate_s": gen_s,
            "s_per_token": gen_s / blk, "threads": torch.get_num_threads()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="a small config (the test's)")
    ap.add_argument("--dir", default=None, help="checkpoint folder to write (default: a temporary one)")
    ap.add_argument("--reuse", action="store_true", help="use --dir as it is when it already holds a checkpoint")
    ap.add_argument("--keep", action="store_true", help="keep the folder afterwards")
    ap.add_argument("--shard-gb", type=float, default=5.0)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--steps-per-block", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.tokens, args.steps_per_block, args.threads)))
        return 0
    cfg = SMALL if args.small else FULL
    shard = int((0.01 if args.small else args.shard_gb) * 1e9)
    made = args.dir is None
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="steerling-load-"))
    try:
        t0 = time.perf_counter()
        if args.reuse and (base / "config.json").is_file():
            info = {"reused": str(base)}
        else:
            need = sum(2 * math.prod(s) for s in release_shapes(cfg).values())
            free = shutil.disk_usage(base if base.exists() else base.parent).free
            if free < need * 1.05:
                print(f"not enough disk at {base}: {need / 1e9:.1f} GB needed, {free / 1e9:.1f} GB free "
                      "(use --dir on a larger disk, or --small)", file=sys.stderr)
                return 2
            info = write_checkpoint(base, cfg, shard)
        write_s = time.perf_counter() - t0
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, __file__, "--child", str(base), "--tokens", str(args.tokens),
               "--steps-per-block", str(args.steps_per_block)] + (["--threads", str(args.threads)] if args.threads else [])
        run = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if run.returncode:
            print(run.stdout + run.stderr, file=sys.stderr)
            return run.returncode
        r = {"config": "small" if args.small else "steerling-8b", "write_s": write_s, **info,
             **json.loads(run.stdout.strip().splitlines()[-1])}
    finally:
        if made and not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(r))
        return 0
    gib = 2 ** 30
    print(f"{r['config']}: {r['parameters']:,} parameters, {r['weight_bytes'] / gib:.2f} GiB of bfloat16 weights "
          f"in {r.get('shards', '?')} shard(s) (written in {write_s:.0f} s)")
    print(f"  from_pretrained {r['load_s']:.2f} s; RSS {r['rss_before_load'] / gib:.2f} GiB before, "
          f"{r['rss_after_load'] / gib:.2f} GiB after loading (memory-mapped, untouched), "
          f"{r['rss_touched'] / gib:.2f} GiB with every weight read ({r['touch_s']:.1f} s): growth "
          f"{r['touched_over_weights']:.3f} x the weights")
    print(f"  peak RSS {r['peak_rss'] / gib:.2f} GiB = {r['peak_over_weights']:.3f} x the weights "
          f"(growth over the process before loading: {r['growth_over_weights']:.3f} x)")
    print(f"  forward, {r['forward_tokens']} tokens: {r['forward_s']:.2f} s; one block of generation "
          f"({r['new_tokens']} tokens, {r['steps_per_block']} steps): {r['generate_s']:.2f} s = "
          f"{r['s_per_token']:.3f} s/token ({r['threads']} threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
