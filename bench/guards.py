"""Time budgets of the language on pathological input: deep and long programs, formatting,
equations, the legend check, and refusing a size before allocating it.

    python bench/guards.py            # every case, each timed once after a warm-up
    python bench/guards.py --strict   # exit 1 when a case takes longer than its budget

The tests check what these cases produce (tests/language/test_check_refusals.py, test_backends_render.py,
test_legend.py build the same inputs); how long they take is measured here, beside its budget,
and printed as a ratio (time / budget: under 1 is within budget). Figures of long chains are
timed by `python bench/render.py --chain`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the inputs are the tests' own generators (tests/ and its layer folders, as pytest's pythonpath)
for folder in ("tests", "tests/rendering", "tests/language"):
    sys.path.insert(0, str(ROOT / folder))


def _cases():
    import penrose
    from penrose.checker import check
    from penrose.errors import PenroseCheckError
    from penrose.fmt import format_diagram
    from penrose.parser import parse, parse_file
    from penrose.rendering.explain import statement_latex, statement_readings, statements
    from penrose.stack import deep
    from penrose.views import legend_warnings
    from test_backends_render import _long
    from test_check_refusals import BIG, deep_calls, deep_parens, deep_scalar, deep_sum

    long_text = _long()
    long_checked = deep(check)(parse(long_text))

    def equations():
        for s in statements(long_checked):
            statement_latex(long_checked, s)
            statement_readings(long_checked, s)

    def refuse_big():
        try:
            penrose.compile(BIG, d=10**12)
        except PenroseCheckError:
            return
        raise AssertionError("a 1e24-element param was not refused")

    diagrams = [parse_file(p) for p in sorted((ROOT / "zoo").rglob("*.pen"))]

    def legends():
        for d in diagrams:
            legend_warnings(d)

    yield "fmt of a 10,000-term sum and 1,000 nested calls", 5.0, lambda: format_diagram(parse(long_text))
    yield "equations and readings of the same", 30.0, equations

    def sum_figure():  # issue: each of 10,000 terms checked against every other as the residual stream (a minute)
        from penrose.rendering.figure import build_figure

        build_figure(long_checked, "statement:3")

    yield "figure of a 10,000-term sum x + x + ... (no layout)", 5.0, sum_figure
    for name, text in [("10,000-term sum", deep_sum(10_000)), ("1,000 nested calls", deep_calls(1_000)),
                       ("1,000 parentheses", deep_parens(1_000)), ("10,000 nested calls", deep_calls(10_000)),
                       ("10,000-term number", deep_scalar(10_000))]:
        yield f"parse + check: {name}", 5.0, (lambda t=text: check(parse(t)))
    yield "compile refuses d = 10^12 before allocating", 5.0, refuse_big
    yield f"legend check of {len(diagrams)} zoo diagrams (budget 2 ms each)", 2e-3 * len(diagrams), legends


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strict", action="store_true", help="exit 1 if a case is over its budget")
    args = ap.parse_args(argv)
    over = 0
    print(f"{'case':58s} {'seconds':>9s} {'budget':>8s} {'ratio':>6s}")
    for name, budget, fn in _cases():
        fn()  # warm-up (imports, caches)
        t0 = time.perf_counter()
        fn()
        secs = time.perf_counter() - t0
        over += secs > budget
        print(f"{name:58s} {secs:9.3f} {budget:8.3f} {secs / budget:6.2f}")
    print(f"{over} case(s) over budget")
    return 1 if over and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
