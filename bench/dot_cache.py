"""The layout cache (penrose/rendering/cache.py): the gallery built cold (an empty cache) and warm
(the cache the cold build left), each in a fresh process, side by side.

    python bench/dot_cache.py                                # the whole gallery (every zoo diagram)
    python bench/dot_cache.py bench/figures/switch_moe.pen   # some diagrams or folders

Prints both wall times and their ratio, and the cache's size; exits 1 unless the two builds are
byte for byte the same (the cache is exact: a hit is what the run would have printed).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(paths: list, out: Path, cache: Path) -> float:
    """Seconds of `penrose gallery PATHS -o out` in a fresh process with the cache in `cache`."""
    env = {**os.environ, "PENROSE_CACHE": str(cache)}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "penrose.cli", "gallery", *paths, "-o", str(out)], cwd=ROOT, env=env,
                   check=True, capture_output=True)
    return time.perf_counter() - t0


def differences(a: Path, b: Path) -> list:
    """Files that differ between two folders, or are in one only."""
    files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    out = sorted(str(p) for p in files_a ^ files_b)
    return out + sorted(str(p) for p in files_a & files_b if not filecmp.cmp(a / p, b / p, shallow=False))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="*", help="diagrams or folders (default: the zoo, as `make gallery`)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="penrose-dot-cache-") as tmp:
        root = Path(tmp)
        cold = build(args.paths, root / "cold", root / "cache")
        size = sum(f.stat().st_size for f in (root / "cache").rglob("*") if f.is_file())
        entries = sum(1 for f in (root / "cache").rglob("*") if f.is_file())
        warm = build(args.paths, root / "warm", root / "cache")
        diff = differences(root / "cold", root / "warm")
    what = " ".join(args.paths) or "the zoo"
    print(f"gallery of {what}:  cold {cold:7.1f} s   warm {warm:7.1f} s   cold/warm {cold / warm:5.2f}x")
    print(f"cache after the cold build: {entries} entries, {size / 2**20:.1f} MB")
    print(f"warm build byte-identical to cold: {not diff}" + (f" (differ: {', '.join(diff[:5])})" if diff else ""))
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
