"""The `penrose` command line: argument parsing only; the work happens in the library."""

from __future__ import annotations

import argparse
import re
import sys
import warnings

EXAMPLES = """\
examples:
  penrose check zoo/paper/self_attention.pen        check a diagram (errors point at line and column)
  penrose compile zoo/paper/mlp.pen -o mlp.py       write standalone PyTorch source
  penrose compile model.pen -o model.py --size t=128 --size e=64
  penrose compile full.pen --entry hidden=hidden.pen -o model.py   one module, two entries
  penrose export model.pen -o model.onnx --size d=64   an ONNX file (dynamic batch), run in onnxruntime
  penrose plan zoo/paper/steerling_listing.pen      contraction plan: FLOPs and largest intermediate
  penrose fmt model.pen                             print canonical formatting (--write to rewrite)
  penrose render zoo/paper/self_attention.pen -o attention.svg
  penrose render --einsum 'bi,ijk,bj->bk' -o fig.svg   the figure of one einsum
  penrose trace model.py:Net --input 4,16 -o net.pen   the diagram of a PyTorch module
  penrose gallery -o gallery/                       build the HTML gallery of every zoo diagram
  penrose cache --clear                             empty the cache of Graphviz's layouts
  penrose serve model.pen                           a live page of the diagram, updated on every save
  penrose zoo list                                  the zoo's models and their parameter counts
"""


_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def ascii_number(text: str, whole: bool = False):
    """A finite number written in ASCII digits (`12`, `-0.5`, `1e-3`), else None: no other
    script's digits (`٣`), no `_` separators, no nan or inf."""
    if not isinstance(text, str) or not _NUMBER.fullmatch(text.strip()):
        return None
    t = text.strip()
    if re.fullmatch(r"[+-]?[0-9]+", t):
        return int(t)
    if whole:
        return None
    value = float(t)
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def ascii_int(text: str) -> int:
    """argparse type: a whole number in ASCII digits (argparse's `int` would take `٣` as 3)."""
    import argparse

    value = ascii_number(text, whole=True)
    if value is None:
        raise argparse.ArgumentTypeError(f"expected a whole number in ASCII digits, got {text!r}")
    return value


def ascii_float(text: str) -> float:
    """argparse type: a finite number in ASCII digits (no nan, inf, `٣` or `1_0`)."""
    import argparse

    value = ascii_number(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"expected a finite number in ASCII digits, got {text!r}")
    return float(value)


def _sizes(items) -> dict:
    """--size NAME=NUMBER, repeated: {name: number}. NAME an identifier, NUMBER in ASCII digits;
    one name given twice must be given the same number."""
    from penrose.errors import PenroseError

    out: dict = {}
    for item in items or []:
        name, eq, value = item.partition("=")
        name = name.strip()
        number = ascii_number(value) if eq else None
        if not _NAME.fullmatch(name) or number is None:
            raise PenroseError(f"--size expects NAME=NUMBER (a dim's size or a const's value; an identifier, then a "
                               f"finite number in ASCII digits), got {item!r}")
        if name in out and out[name] != number:
            raise PenroseError(f"--size {name} is given twice, as {out[name]} and {number}; give it once")
        out[name] = number
    return out


def _entries(items) -> dict:
    """--entry NAME=FILE, repeated: {method name: path}."""
    from penrose.errors import PenroseError

    out = {}
    for item in items or []:
        name, eq, path = item.partition("=")
        if not eq or not name.strip() or not path.strip():
            raise PenroseError(f"--entry takes NAME=FILE, got {item!r}")
        out[name.strip()] = _path(path.strip())
    return out


def _write_or_print(out: str | None, text: str) -> None:
    """Text to the -o file (atomically; `_output` has checked it), or to standard output."""
    from penrose.io import atomic_write_text

    if out:
        atomic_write_text(out, text)
        print(f"wrote {out}")
    else:
        sys.stdout.write(text)


def _include_path_option(sp) -> None:
    sp.add_argument(
        "--include-path", action="append", default=[], metavar="DIR", dest="include_paths",
        help="a folder includes may also reach and are searched in (default: only the diagram's own folder)",
    )


def _path(arg: str):
    """A command-line file argument, always a path (penrose.load reads a str with a line break as text)."""
    from pathlib import Path

    return arg if "\n" not in arg and "\r" not in arg else Path(arg)


def _output(out: str, *inputs: str):
    """Refuse a bad `-o` before any work: a folder, a device, a read-only file, the input itself."""
    import os

    from penrose.errors import PenroseError, Span
    from penrose.io import writable_target

    target = writable_target(out)
    for f in inputs:
        if os.path.exists(target) and os.path.exists(f) and os.path.samefile(target, f):
            raise PenroseError(f"cannot write {out}: it is the diagram {f} itself", Span(out))


COMMANDS = "penrose.commands"  # the entry-point group through which packages (the zoo) add commands


def _discovered() -> dict:
    """name -> entry point, for the commands installed packages add (pyproject.toml's
    `[project.entry-points."penrose.commands"]`). The target is `main(argv) -> int`, given the
    arguments after the command's name, and imported only when its command runs."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=COMMANDS)}


class _Parser(argparse.ArgumentParser):
    built_in: set[str]  # the built-in commands' names


def _parser(discovered=None) -> _Parser:
    """The built-in commands, and the `discovered` ones listed (their targets parse their own arguments)."""
    p = _Parser(
        prog="penrose",
        description="Penrose tensor-network diagrams (.pen) → checks, PyTorch modules, figures.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from penrose import __version__

    p.add_argument("--version", action="version", version=f"penrose {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def add(name, help, example):
        sp = sub.add_parser(name, help=help, description=help, epilog=f"example:\n  {example}", formatter_class=argparse.RawDescriptionHelpFormatter)
        return sp

    c = add("check", "check a diagram and print its tensors and legs", "penrose check zoo/paper/mlp.pen")
    c.add_argument("files", nargs="+")
    c.add_argument("--size", action="append", metavar="NAME=N", help="override a dim's size or a const's value")
    _include_path_option(c)

    c = add("compile", "write the diagram as standalone PyTorch source", "penrose compile zoo/paper/mlp.pen -o mlp.py")
    c.add_argument("file")
    c.add_argument("-o", "--output", help="output .py file (default: print)")
    c.add_argument("--size", action="append", metavar="NAME=N")
    c.add_argument("--entry", action="append", metavar="NAME=FILE", dest="entries",
                   help="another diagram as method NAME of the same module, on the same parameters (shared by name)")
    _include_path_option(c)

    c = add("export", "write the diagram as an ONNX file (dynamic batch; checked, and run in onnxruntime against PyTorch)",
            "penrose export zoo/paper/mlp.pen -o mlp.onnx")
    c.add_argument("file")
    c.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    c.add_argument("--size", action="append", metavar="NAME=N")
    c.add_argument("--seed", type=ascii_int, default=0, help="the seed of the weights' initialisation (default 0)")
    c.add_argument("--batch", type=ascii_int, default=2, help="the example batch size traced (default 2)")
    c.add_argument("--static-batch", action="store_false", dest="dynamic_batch",
                   help="a batch of exactly --batch (default: any batch size)")
    c.add_argument("--opset", type=ascii_int, help="the ONNX opset (default: the exporter's)")
    c.add_argument("--no-verify", action="store_false", dest="verify", help="do not run the file in onnxruntime against PyTorch")
    _include_path_option(c)

    c = add("plan", "print each contraction's plan, FLOPs (a block's times its runs, repeats included) and largest intermediate", "penrose plan zoo/paper/steerling_listing.pen")
    c.add_argument("file")
    c.add_argument("--size", action="append", metavar="NAME=N")
    _include_path_option(c)

    c = add("fmt", "print the canonical formatting of diagrams", "penrose fmt --write zoo/paper/*.pen")
    c.add_argument("files", nargs="+")
    c.add_argument("--write", action="store_true", help="rewrite the files in place")
    c.add_argument("--check", action="store_true", help="exit 1 if a file is not formatted")

    c = add("render", "draw a diagram as a Penrose figure (svg, png, pdf or TikZ for LaTeX)", "penrose render zoo/paper/mlp.pen -o mlp.svg\n  penrose render zoo/paper/mlp.pen -o mlp.tex --snippet --max-width 340")
    c.add_argument("file", nargs="?")
    c.add_argument("--einsum", metavar="SPEC", help="draw this einsum instead of a file, one input per operand ('bi,ijk,bj->bk'; --size b=4 sizes a letter)")
    c.add_argument("-o", "--output", help="the figure file; its extension picks the format (.svg .png .pdf, .tex for TikZ). "
                   "Without -o, svg or TikZ text is printed")
    c.add_argument("--format", metavar="FORMAT", help="svg | png | pdf | tikz (default: from the -o file's extension, else svg)")
    c.add_argument("--snippet", action="store_true", help="TikZ: only the tikzpicture environment, to \\input into a paper")
    c.add_argument("--max-width", type=ascii_float, metavar="N", dest="max_width",
                   help="scale the figure down (never up) to at most N wide: pixels for svg and png, points for pdf and TikZ")
    c.add_argument("--view", default="diagram", help="diagram | statement:N | block:NAME (default: diagram)")
    c.add_argument("--direction", choices=["LR", "TB"], default="LR", help="left to right (default) or top-down")
    c.add_argument("--sizes", action="store_true", help="label each wire with its size")
    c.add_argument("--plan", action="store_true", help="annotate contractions with the compiler's plan")
    c.add_argument("--unfold", action="store_true", help="draw repeated blocks unfolded")
    c.add_argument("--copies", action="store_true",
                   help="draw a tensor several contractions read once per contraction (default: once, its legs branching)")
    c.add_argument("--size", action="append", metavar="NAME=N")
    c.add_argument("--report", action="store_true",
                   help="print the figure report (crossings, labels crossed, overflows, clipping, copies, size) "
                        "measured on the drawn SVG, instead of the SVG (with -o, after writing the file)")
    _include_path_option(c)

    c = add("trace", "write the .pen diagram of a PyTorch module (through torch.export)", "penrose trace model.py:Net --input 4,16 -o net.pen")
    c.add_argument("target", metavar="MODULE:CLASS", help="a dotted module or a .py file, then the class (built with no arguments)")
    c.add_argument("--input", action="append", metavar="SHAPE", dest="inputs", help="an example input's shape, 4,16 or 4x16 (:int ids, :bool a mask); one per input")
    c.add_argument("--dim", action="append", metavar="NAME=AXIS", dest="dims", help="name an axis of the first input (axis 0: the batch, as a leg)")
    c.add_argument("--notes", action="store_true", help="keep each statement's source line as its note")
    c.add_argument("--no-verify", action="store_false", dest="verify", help="do not run the diagram against the module")
    c.add_argument("-o", "--output", help="the .pen file (default: print)")

    c = add("gallery", "build the static HTML gallery", "penrose gallery -o gallery/")
    c.add_argument("paths", nargs="*", help="diagrams or folders (default: the zoo)")
    c.add_argument("-o", "--output", default="gallery")

    c = add("cache", "where the cache of Graphviz's layouts is, its size; --clear empties it (docs/rendering.md)",
            "penrose cache --clear")
    c.add_argument("--clear", action="store_true", help="remove every entry")

    c = add("lsp", "the language server for editors (LSP over stdio; needs the editor extra)", "penrose lsp")
    c.add_argument("--stdio", action="store_true", help="speak over stdin/stdout (the default)")
    _include_path_option(c)

    c = add("serve", "a live page of a diagram: figure, Rosetta stone, PyTorch and errors, updated on every save",
            "penrose serve zoo/paper/mlp.pen --port 8000")
    c.add_argument("path", help="a .pen file, or a folder of them")
    c.add_argument("--port", type=ascii_int, default=8000, help="0 picks a free port (default 8000)")
    c.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine only); requests must name it (with the port) in their Host header, others get 403 (docs/security.md)")
    c.add_argument("--size", action="append", metavar="NAME=N")
    _include_path_option(c)

    p.built_in = set(sub.choices)
    for name, ep in sorted((discovered or {}).items()):
        if name not in p.built_in:
            sub.add_parser(name, help=f"from {ep.value} (penrose {name} --help)", add_help=False)
    return p


def _parse(argv: list) -> argparse.Namespace:
    """A built-in command's arguments through argparse; a discovered command's, untouched, to it."""
    parser = _parser()
    if argv and argv[0] in parser.built_in:  # no entry-point scan: `penrose check` answers at once
        return parser.parse_args(argv)
    discovered = _discovered()
    if argv and argv[0] in discovered:
        return argparse.Namespace(command=argv[0], entry_point=discovered[argv[0]], rest=argv[1:])
    return _parser(discovered).parse_args(argv)  # --help and "invalid choice" list them too


def main(argv=None) -> int:
    from penrose.errors import PenroseError, PenroseWarning

    args = _parse(list(sys.argv[1:] if argv is None else argv))
    if not args.command:
        _parser(_discovered()).print_help()
        return 2
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            code = _run(args)
        for w in caught:  # a PenroseWarning (penrose export's checker warnings) at its place in the diagram
            print(w.message.render() if isinstance(w.message, PenroseWarning) else f"warning: {w.message}", file=sys.stderr)
        return code
    except PenroseError as e:
        print(e.render(), file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except OSError as e:  # the terminal or a pipe failing, not a diagram: no traceback
        print(f"error: {e.strerror or e}" + (f": {e.filename}" if e.filename else ""), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _print_warnings(checked):
    from penrose.errors import warning_text

    for msg, span in checked.warnings:
        print(warning_text(msg, span), file=sys.stderr)


def _quiet_load(*args, **kwargs):
    """penrose.load without PenroseWarnings: the commands print the checker's warnings themselves."""
    from penrose.loader import load_entries

    return load_entries(*args, **kwargs)[0]


def _run(args) -> int:
    import penrose

    if getattr(args, "entry_point", None) is not None:
        return _load(args.entry_point)(args.rest)
    if args.command == "check":
        for f in args.files:
            c = _quiet_load(_path(f), include_paths=args.include_paths, sizes=_sizes(args.size))
            _print_warnings(c)
            print(f"{f}: ok — {len(c.inputs)} input(s), {c.param_count():,} parameter(s), outputs "
                  + ", ".join(f"{n}[{', '.join(t.legs)}]" for n, t in c.outputs))
        return 0
    if args.command == "compile":
        from penrose.compiler import generate_source
        from penrose.loader import load_entries

        if args.output:
            _output(args.output, args.file)
        c, more = load_entries(_path(args.file), entries=_entries(args.entries), include_paths=args.include_paths,
                               sizes=_sizes(args.size))
        for checked in (c, *more.values()):
            _print_warnings(checked)
        _write_or_print(args.output, generate_source(c, entries=more))
        return 0
    if args.command == "export":
        from penrose.export import export_onnx

        _output(args.output, args.file)
        export_onnx(_path(args.file), args.output, seed=args.seed, include_paths=args.include_paths, sizes=_sizes(args.size),
                    batch=args.batch, dynamic_batch=args.dynamic_batch, opset=args.opset, verify=args.verify)
        print(f"wrote {args.output}")
        return 0
    if args.command == "plan":
        from penrose.report import plan_report

        print(plan_report(_quiet_load(_path(args.file), include_paths=args.include_paths, sizes=_sizes(args.size))))
        return 0
    if args.command == "fmt":
        from penrose.io import atomic_write_text, read_text

        bad = 0
        for f in args.files:
            raw = read_text(f)  # as on disk: fmt drops a byte-order mark, keeps CRLF if the file uses it
            text = penrose.format_diagram(penrose.parse(raw, file=f))
            first = raw.find("\n")
            if first > 0 and raw[first - 1] == "\r":
                text = text.replace("\n", "\r\n")
            if args.check:
                if text != raw:
                    print(f"{f}: not formatted")
                    bad = 1
            elif args.write:
                if text != raw:
                    atomic_write_text(f, text)
                    print(f"formatted {f}")
            else:
                sys.stdout.write(text)
        return bad
    if args.command == "render":
        from penrose.errors import PenroseRenderError
        from penrose.rendering import TEXT_FORMATS, figure_format, render, render_file

        # the format first (a bad one is refused before any work), then the place to write
        fmt = figure_format(args.format, args.output) if args.output else figure_format(args.format or "svg")
        if (args.file is None) == (args.einsum is None):
            raise PenroseRenderError("render takes a diagram file or --einsum SPEC (one of them)")
        if args.output:
            _output(args.output, *([args.file] if args.file else []))
        elif fmt not in TEXT_FORMATS:
            raise PenroseRenderError(f"a {fmt} figure is binary: write it to a file with -o FILE")
        if args.snippet and fmt != "tikz":
            raise PenroseRenderError(f"--snippet is for TikZ figures (--format tikz or a .tex file), not {fmt}")
        if args.einsum is not None:
            from penrose.tracing.einsum import einsum_text

            c = _quiet_load(text=einsum_text(args.einsum, _sizes(args.size)))
        else:
            c = _quiet_load(_path(args.file), include_paths=args.include_paths, sizes=_sizes(args.size))
        options = dict(view=args.view, direction=args.direction, show_sizes=args.sizes, show_plan=args.plan,
                       unfold=args.unfold, max_width=args.max_width, snippet=args.snippet, copies=args.copies)
        if args.output:
            out = render_file(c, args.output, fmt=fmt, **options)
            print(f"wrote {out}")
        elif not args.report:
            sys.stdout.write(render(c, fmt, **options))
        if args.report:
            from penrose.rendering.measure import measure

            print(measure(render(c, "svg", **dict(options, snippet=False))))
        return 0
    if args.command == "trace":
        from penrose.tracing.run import trace_command

        if args.output:
            _output(args.output)
        _write_or_print(args.output, trace_command(args.target, args.inputs, args.dims, verify=args.verify, notes=args.notes))
        return 0
    if args.command == "gallery":
        from penrose.rendering.gallery import build_gallery

        out = build_gallery(args.paths or None, args.output)
        print(f"wrote {out}")
        return 0
    if args.command == "cache":
        from penrose.rendering import cache

        where = cache.folder()
        if where is None:
            print("the cache is off (PENROSE_CACHE=off)")
            return 0
        if args.clear:
            print(f"removed {cache.clear()} entries from {where}")
            return 0
        found = cache.entries()
        print(f"{where}: {len(found)} entries, {sum(size for _, size, _ in found) / 2**20:.1f} MB "
              f"(kept under {cache.limit_bytes() / 2**20:.0f} MB, PENROSE_CACHE_MB)")
        return 0
    if args.command == "lsp":
        from penrose.lsp import run_stdio

        return run_stdio(args.include_paths)
    if args.command == "serve":
        from penrose.serve import serve

        return serve(args.path, host=args.host, port=args.port, include_paths=args.include_paths, sizes=_sizes(args.size))
    return 2


def _load(ep):
    """A discovered command's `main`; a package it needs and lacks is an error, not a traceback."""
    from penrose.errors import PenroseError

    try:
        return ep.load()
    except ImportError as e:
        raise PenroseError(f"command {ep.name!r} ({ep.value}) cannot be loaded: {e}") from e


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
