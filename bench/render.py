"""Rendering speed: one figure of the Steerling-8B listing (target < 2 s), and the whole gallery.

    python bench/render.py            # both
    python bench/render.py --figure   # only the figure

Prints wall time and CPU time (the process and its Graphviz children); the figure is timed cold
(a fresh process: imports, parse, check, layout) and warm (again, in the same process).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEERLING = ROOT / "zoo" / "paper" / "steerling_listing.pen"


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def time_figure() -> None:
    out = Path(tempfile.mkdtemp()) / "steerling.svg"
    code = (
        "import time; t = time.perf_counter(); from penrose.render import render_file; "
        f"render_file({str(STEERLING)!r}, {str(out)!r}); print(time.perf_counter() - t)"
    )
    t0 = time.perf_counter()
    cold_inner = float(subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True).stdout)
    cold = time.perf_counter() - t0
    from penrose.render import render_file

    render_file(STEERLING, out)
    t0, c0 = time.perf_counter(), _cpu()
    for _ in range(3):
        render_file(STEERLING, out)
    warm, warm_cpu = (time.perf_counter() - t0) / 3, (_cpu() - c0) / 3
    status = "ok" if cold < 2.0 else "SLOW"
    print(f"render {STEERLING.relative_to(ROOT)} -> svg: cold {cold:.2f} s (python start included; "
          f"{cold_inner:.2f} s inside), warm {warm:.2f} s ({warm_cpu:.2f} s CPU)  [target < 2 s: {status}]")


def time_gallery() -> None:
    from penrose.render.gallery import build_gallery, find_diagrams

    out = tempfile.mkdtemp(prefix="penrose-gallery-")
    n = len(find_diagrams())
    t0, c0 = time.perf_counter(), _cpu()
    build_gallery(None, out)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    files = sum(len(f) for _, _, f in os.walk(out))
    size = sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file())
    print(f"gallery of {n} .pen files -> {files} files, {size / 1e6:.1f} MB: {wall:.1f} s ({cpu:.1f} s CPU)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--figure", action="store_true", help="only time the Steerling figure")
    args = p.parse_args(argv)
    if not STEERLING.exists():
        print(f"missing {STEERLING}", file=sys.stderr)
        return 1
    time_figure()
    if not args.figure:
        time_gallery()
    return 0


if __name__ == "__main__":
    sys.exit(main())
