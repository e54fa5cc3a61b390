"""Rendering speed: one figure of the Steerling-8B listing (target < 2 s), and the whole gallery.

    python bench/render.py            # both
    python bench/render.py --figure   # only the figure
    python bench/render.py --chain    # long chains: a tied residual chain beside a plain one
    python bench/render.py --chain --lengths 10,100 --no-tie --no-fold   # as before ties and rows

`--chain` renders, for each length N, a residual chain that reuses one weight
(`h{i} = relu(einsum('td,de->te', h{i-1}, W)) + h{i-1}`, N times) and a plain chain of N ReLUs,
and prints the seconds each takes (targets: 100 tied steps under 10 s, 1,000 under 60 s).
`--no-tie` draws every use of W as a copy branching off one node, `--no-fold` keeps the figure
in one row (the layouts before tied copies and folded rows); a layout Graphviz does not finish
within `--timeout` seconds prints as `> T s`.

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
        "import time; t = time.perf_counter(); from penrose.rendering import render_file; "
        f"render_file({str(STEERLING)!r}, {str(out)!r}); print(time.perf_counter() - t)"
    )
    t0 = time.perf_counter()
    cold_inner = float(subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True).stdout)
    cold = time.perf_counter() - t0
    from penrose.rendering import render_file

    render_file(STEERLING, out)
    t0, c0 = time.perf_counter(), _cpu()
    for _ in range(3):
        render_file(STEERLING, out)
    warm, warm_cpu = (time.perf_counter() - t0) / 3, (_cpu() - c0) / 3
    status = "ok" if cold < 2.0 else "SLOW"
    print(f"render {STEERLING.relative_to(ROOT)} -> svg: cold {cold:.2f} s (python start included; "
          f"{cold_inner:.2f} s inside), warm {warm:.2f} s ({warm_cpu:.2f} s CPU)  [target < 2 s: {status}]")


def time_gallery() -> None:
    from penrose.rendering.gallery import build_gallery, find_diagrams

    out = tempfile.mkdtemp(prefix="penrose-gallery-")
    n = len(find_diagrams())
    t0, c0 = time.perf_counter(), _cpu()
    build_gallery(None, out)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    files = sum(len(f) for _, _, f in os.walk(out))
    size = sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file())
    print(f"gallery of {n} .pen files -> {files} files, {size / 1e6:.1f} MB: {wall:.1f} s ({cpu:.1f} s CPU)")


def tied_chain(n: int) -> str:
    """A residual chain of n steps that reuses one weight W (tied weights)."""
    lines = ["dim t = 4, d = 8", "input h0[t, d]", "param W[d, d]"]
    lines += [f"h{i} = relu(einsum('td,de->te', h{i - 1}, W)) + h{i - 1}" for i in range(1, n + 1)]
    return "\n".join(lines + [f"output h{n}"]) + "\n"


def plain_chain(n: int) -> str:
    """A chain of n ReLUs."""
    lines = ["dim t = 4, d = 8", "input h0[t, d]"]
    lines += [f"h{i} = relu(h{i - 1})" for i in range(1, n + 1)]
    return "\n".join(lines + [f"output h{n}"]) + "\n"


def time_render(text: str, fold: bool = True, tie: bool = True, timeout: float = 60.0):
    """(seconds to draw the figure: build, DOT and Graphviz's layout to SVG, or None past
    `timeout`; its number of rows)."""
    from penrose.checker import check
    from penrose.errors import PenroseRenderError
    from penrose.parser import parse
    from penrose.rendering import figure
    from penrose.rendering.graphviz import run_dot

    saved = figure.TIE_READS
    figure.TIE_READS = saved if tie else 10 ** 9
    try:
        c = check(parse(text))
        t0 = time.perf_counter()
        fig = figure.build_figure(c, "diagram", figure.Options(fold=fold))
        try:
            run_dot(figure.to_dot(fig), "svg", timeout=timeout)
        except PenroseRenderError:
            return None, fig.rows
        return time.perf_counter() - t0, fig.rows
    finally:
        figure.TIE_READS = saved


def time_chains(lengths, fold: bool = True, tie: bool = True, timeout: float = 60.0) -> None:
    how = ", ".join(w for w, on in (("tied copies", tie), ("folded rows", fold)) if on) or "one W node, one row"
    print(f"render time by chain length ({how}; svg, build + layout):")
    print(f"{'steps':>7}  {'tied residual chain':>22}  {'plain chain':>16}")
    for n in lengths:
        cells = []
        for text in (tied_chain(n), plain_chain(n)):
            secs, rows = time_render(text, fold, tie, timeout)
            cell = f"> {timeout:.0f} s" if secs is None else f"{secs:.2f} s"
            cells.append(cell + (f" ({rows} rows)" if rows > 1 else ""))
        print(f"{n:>7}  {cells[0]:>22}  {cells[1]:>16}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--figure", action="store_true", help="only time the Steerling figure")
    p.add_argument("--chain", action="store_true", help="only time long chains, tied residual and plain")
    p.add_argument("--lengths", default="10,30,100,300,1000", help="chain lengths for --chain (comma-separated)")
    p.add_argument("--no-tie", action="store_true", help="--chain: W as one node that branches to every use")
    p.add_argument("--no-fold", action="store_true", help="--chain: the figure in one row")
    p.add_argument("--timeout", type=float, default=60.0, help="--chain: seconds a layout may take")
    args = p.parse_args(argv)
    if args.chain:
        time_chains([int(x) for x in args.lengths.split(",") if x.strip()], not args.no_fold, not args.no_tie, args.timeout)
        return 0
    if not STEERLING.exists():
        print(f"missing {STEERLING}", file=sys.stderr)
        return 1
    time_figure()
    if not args.figure:
        time_gallery()
    return 0


if __name__ == "__main__":
    sys.exit(main())
