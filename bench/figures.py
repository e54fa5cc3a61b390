"""The figure report over every figure the gallery draws, and over diagrams new users wrote.

    python bench/figures.py                  # totals: the gallery's figures, then bench/figures/*.pen's
    python bench/figures.py --list           # and a row for every figure with something to fix
    python bench/figures.py --all            # a row for every figure
    python bench/figures.py --svg gallery/   # the SVGs under a folder as they are (a committed gallery)
    python bench/figures.py zoo/paper/mlp.pen bench/figures/retention.pen   # these diagrams' figures

Each figure is measured on its drawn SVG by `penrose.rendering.measure` (the same report as
`penrose render FILE --report`): wire crossings, labels a wire runs through, labels over their
node's outline, wires through nodes, overlapping texts, anything outside the page, copies (a
tensor drawn again) and the page's size. The figures are the gallery's — for each diagram its
figure, thumbnail, contraction plan, every statement, every block and every block statement —
laid out as `penrose gallery` lays them out (equations are not drawn).

The new users' diagrams (bench/figures/*.pen) were written as a new user would write them:
a retention block, a switch mixture of experts, a `where`, a block called twice with the same
weights, names with underscores, a transformer layer viewed as a block; and ten more written
afterwards, which no layout change had been tried on: a SwiGLU feed-forward, cross-attention, a
graph convolution, a concept bottleneck with a side channel, a LoRA adapter, a tied autoencoder,
a residual block with two norms, a mixture chosen by a `where`, a prototype layer and an
additive model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from penrose.rendering.measure import measure  # noqa: E402

NEW_USERS = sorted((ROOT / "bench" / "figures").glob("*.pen"))
COLUMNS = ("crossings", "labels crossed", "overflows", "through", "overlaps", "clipped", "copies")
HEADS = ("cross", "label", "over", "thru", "overlap", "clip", "copies")


def gallery_svgs(paths=None) -> dict:
    """{figure path: SVG bytes} of every figure the gallery draws for `paths` (default: the zoo)."""
    from penrose.rendering.gallery import build_files

    files = build_files([str(p) for p in paths] if paths else None, equation_svg=lambda latex: b"")
    return {k: v for k, v in files.items() if k.endswith(".svg") and not k.startswith("equations/")}


def folder_svgs(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*.svg"))
            if "equations" not in p.parts}


def report(name: str, svgs: dict, rows: str) -> dict:
    """Print the group's rows (none, those with a defect, or all) and totals; return the totals."""
    totals = dict.fromkeys(COLUMNS, 0)
    flawed = 0
    main = dict.fromkeys(COLUMNS, 0)
    mains = flawed_mains = 0
    print(f"\n{name}: {len(svgs)} figures")
    print(f"  {'figure':58s} " + " ".join(f"{h:>7s}" for h in HEADS) + ("     size (pt)" if rows != "none" else ""))
    for path, svg in svgs.items():
        r = measure(svg)
        c = r.counts()
        bad = r.defects() > 0
        flawed += bad
        is_main = "/" not in path.removeprefix("figures/")  # figures/<slug>.svg: the diagram's own figure
        mains += is_main
        flawed_mains += bad and is_main
        for k in COLUMNS:
            totals[k] += c[k]
            if is_main:
                main[k] += c[k]
        if rows == "all" or (rows == "defects" and bad):
            print(f"  {path[:58]:58s} " + " ".join(f"{c[k]:7d}" for k in COLUMNS) + f"  {c['width']:5d} x {c['height']}")
    print(f"  {'total':58s} " + " ".join(f"{totals[k]:7d}" for k in COLUMNS))
    own = f"  of which the diagrams' own figures ({mains})"
    print(f"  {own:58s} " + " ".join(f"{main[k]:7d}" for k in COLUMNS))
    print(f"  figures with something to fix: {flawed} of {len(svgs)} ({flawed_mains} of the {mains} diagrams' own figures)")
    return totals


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", help="diagrams to measure (default: the zoo's gallery, then bench/figures/*.pen)")
    ap.add_argument("--svg", metavar="DIR", help="measure the SVG files under DIR as they are")
    ap.add_argument("--list", action="store_true", help="a row for every figure with something to fix")
    ap.add_argument("--all", action="store_true", help="a row for every figure")
    args = ap.parse_args(argv)
    rows = "all" if args.all else "defects" if args.list else "none"
    if args.svg:
        report(args.svg, folder_svgs(Path(args.svg)), rows)
    elif args.paths:
        report("the figures of " + ", ".join(args.paths), gallery_svgs(args.paths), rows)
    else:
        report("the gallery (zoo, paper listings, Steerling)", gallery_svgs(), rows)
        report("new users' diagrams (bench/figures/*.pen)", gallery_svgs(NEW_USERS), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
