"""The `penrose` command line: argument parsing only; the work happens in the library."""

from __future__ import annotations

import argparse
import sys
import warnings

EXAMPLES = """\
examples:
  penrose check zoo/paper/self_attention.pen        check a diagram (errors point at line and column)
  penrose compile zoo/paper/mlp.pen -o mlp.py       write standalone PyTorch source
  penrose compile model.pen -o model.py --size t=128 --size e=64
  penrose plan zoo/paper/steerling_listing.pen      contraction plan: FLOPs and largest intermediate
  penrose fmt model.pen                             print canonical formatting (--write to rewrite)
  penrose render zoo/paper/self_attention.pen -o attention.svg
  penrose gallery -o gallery/                       build the HTML gallery of every zoo diagram
  penrose zoo list                                  the zoo's models and their parameter counts
"""


def _sizes(items) -> dict:
    from penrose.errors import PenroseError

    out = {}
    for item in items or []:
        name, _, value = item.partition("=")
        if not value.strip().isdigit():
            raise PenroseError(f"--size expects NAME=INTEGER, got {item!r}")
        out[name.strip()] = int(value)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="penrose",
        description="Penrose tensor-network diagrams (.pen) → checks, PyTorch modules, figures.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def add(name, help, example):
        sp = sub.add_parser(name, help=help, description=help, epilog=f"example:\n  {example}", formatter_class=argparse.RawDescriptionHelpFormatter)
        return sp

    c = add("check", "check a diagram and print its tensors and legs", "penrose check zoo/paper/mlp.pen")
    c.add_argument("files", nargs="+")
    c.add_argument("--size", action="append", metavar="NAME=N", help="override a dim's size")

    c = add("compile", "write the diagram as standalone PyTorch source", "penrose compile zoo/paper/mlp.pen -o mlp.py")
    c.add_argument("file")
    c.add_argument("-o", "--output", help="output .py file (default: print)")
    c.add_argument("--size", action="append", metavar="NAME=N")

    c = add("plan", "print each contraction's plan, FLOPs and largest intermediate", "penrose plan zoo/paper/steerling_listing.pen")
    c.add_argument("file")
    c.add_argument("--size", action="append", metavar="NAME=N")

    c = add("fmt", "print the canonical formatting of diagrams", "penrose fmt --write zoo/paper/*.pen")
    c.add_argument("files", nargs="+")
    c.add_argument("--write", action="store_true", help="rewrite the files in place")
    c.add_argument("--check", action="store_true", help="exit 1 if a file is not formatted")

    c = add("render", "draw a diagram as a Penrose figure (svg, png or pdf)", "penrose render zoo/paper/mlp.pen -o mlp.svg")
    c.add_argument("file")
    c.add_argument("-o", "--output", required=True)
    c.add_argument("--view", default="diagram", help="diagram | statement:N | block:NAME (default: diagram)")
    c.add_argument("--direction", choices=["LR", "TB"], default="LR", help="left to right (default) or top-down")
    c.add_argument("--sizes", action="store_true", help="label each wire with its size")
    c.add_argument("--plan", action="store_true", help="annotate contractions with the compiler's plan")
    c.add_argument("--unfold", action="store_true", help="draw repeated blocks unfolded")
    c.add_argument("--size", action="append", metavar="NAME=N")

    c = add("gallery", "build the static HTML gallery", "penrose gallery -o gallery/")
    c.add_argument("paths", nargs="*", help="diagrams or folders (default: the zoo)")
    c.add_argument("-o", "--output", default="gallery")

    c = add("zoo", "the interpretable zoo", "penrose zoo list")
    c.add_argument("action", choices=["list"])

    c = add("steerling", "Steerling concept language model: generate, train, explain, steer, evaluate", "penrose steerling generate --checkpoint ckpt --prompt 'Hello'")
    c.add_argument("rest", nargs=argparse.REMAINDER)
    return p


def main(argv=None) -> int:
    from penrose.errors import PenroseError

    args = _parser().parse_args(argv)
    if not args.command:
        _parser().print_help()
        return 2
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            code = _run(args)
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
        return code
    except PenroseError as e:
        print(e.render(), file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


def _print_warnings(checked):
    for msg, span in checked.warnings:
        loc = f"{span}: " if span.line else ""
        print(f"{loc}warning: {msg}", file=sys.stderr)


def _run(args) -> int:
    import penrose

    if args.command == "check":
        for f in args.files:
            c = penrose.load(f, **_sizes(args.size))
            _print_warnings(c)
            print(f"{f}: ok — {len(c.inputs)} input(s), {c.param_count():,} parameter(s), outputs "
                  + ", ".join(f"{n}[{', '.join(t.legs)}]" for n, t in c.outputs))
        return 0
    if args.command == "compile":
        from penrose.compiler import generate_source
        from penrose.io import atomic_write_text

        c = penrose.load(args.file, **_sizes(args.size))
        _print_warnings(c)
        src = generate_source(c)
        if args.output:
            atomic_write_text(args.output, src)
            print(f"wrote {args.output}")
        else:
            sys.stdout.write(src)
        return 0
    if args.command == "plan":
        from penrose.report import plan_report

        print(plan_report(penrose.load(args.file, **_sizes(args.size))))
        return 0
    if args.command == "fmt":
        from penrose.io import atomic_write_text

        bad = 0
        for f in args.files:
            d = penrose.parse_file(f)
            text = penrose.format_diagram(d)
            if args.check:
                if text != d.source:
                    print(f"{f}: not formatted")
                    bad = 1
            elif args.write:
                if text != d.source:
                    atomic_write_text(f, text)
                    print(f"formatted {f}")
            else:
                sys.stdout.write(text)
        return bad
    if args.command == "render":
        from penrose.render import render_file

        out = render_file(
            args.file, args.output, view=args.view, direction=args.direction, show_sizes=args.sizes,
            show_plan=args.plan, unfold=args.unfold, sizes=_sizes(args.size),
        )
        print(f"wrote {out}")
        return 0
    if args.command == "gallery":
        from penrose.render.gallery import build_gallery

        out = build_gallery(args.paths or None, args.output)
        print(f"wrote {out}")
        return 0
    if args.command == "zoo":
        import zoo

        for line in zoo.list_lines():
            print(line)
        return 0
    if args.command == "steerling":
        from zoo.steerling.cli import main as steerling_main

        return steerling_main(args.rest)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
