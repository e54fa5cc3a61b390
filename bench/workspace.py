"""What the workspace saves: a check answered from its cache, and a change that re-reads one file.

    python bench/workspace.py            # zoo/steerling/steerling.pen (four includes), 21 rounds
    python bench/workspace.py --small    # 7 rounds (PENROSE_REDUCED=1 does the same)

Copies Steerling's diagrams to a scratch folder and prints, side by side, median times of:

- `penrose.load(path)`: the one loader, everything read, parsed and checked each time;
- `Workspace.load(path)`, nothing changed: the stamps looked at, the checked diagram returned;
- `Workspace.load(path)` after `dims.pen` (included by every other file) changed: that file
  parsed again, the others taken from the cache, then checked;

with the ratios to the first, and the workspace's parse count (the files parsed per change).
Both sides give the same checked diagram (asserted: the same sizes, parameters and outputs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _median(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="7 rounds")
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args(argv)
    small = args.small or os.environ.get("PENROSE_REDUCED", "") not in ("", "0")
    rounds = args.rounds or (7 if small else 21)

    import penrose
    from penrose.workspace import Workspace

    folder = Path(tempfile.mkdtemp())
    try:
        for f in (ROOT / "zoo" / "steerling").glob("*.pen"):
            shutil.copy(f, folder / f.name)
        main_pen, dims = folder / "steerling.pen", folder / "dims.pen"
        dims_text = dims.read_text()

        def same(a, b) -> bool:
            return (a.dim_sizes(), a.param_count(), [n for n, _ in a.outputs]) == (b.dim_sizes(), b.param_count(), [n for n, _ in b.outputs])

        ws = Workspace()
        want = penrose.load(main_pen)
        assert same(ws.load(main_pen), want)
        files = len(ws.files(main_pen))
        fresh = _median(lambda: penrose.load(main_pen), rounds)
        cached = _median(lambda: ws.load(main_pen), rounds)

        tick = [0]

        def changed():
            tick[0] += 1
            dims.write_text(dims_text + f"# edit {tick[0]}\n")  # a longer file: its stamp moves
            return ws.load(main_pen)

        before = ws.parses
        after_change = _median(changed, rounds)
        per_change = (ws.parses - before) / rounds
        assert same(changed(), want)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    print(f"zoo/steerling/steerling.pen ({files} files: the diagram and its includes), median of {rounds}:")
    print(f"  penrose.load (read, parse, check)      {fresh * 1e3:8.2f} ms   1.00x")
    print(f"  Workspace.load, nothing changed        {cached * 1e3:8.2f} ms   {fresh / cached:6.1f}x faster")
    print(f"  Workspace.load, dims.pen changed       {after_change * 1e3:8.2f} ms   {fresh / after_change:6.2f}x faster"
          f"   ({per_change:.0f} file parsed per change, of {files})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
