"""How fast the command line answers, and how fast diagrams parse and check.

    python bench/cli_latency.py                    # zoo/paper/self_attention.pen, 9 runs, 10,000 statements
    python bench/cli_latency.py --small            # 3 runs, 2,000 statements (PENROSE_REDUCED=1 does the same)
    python bench/cli_latency.py --strict           # exit 1 when a target is missed
    python bench/cli_latency.py --file zoo/mlp.pen --runs 15

Prints, beside `python -c pass` (the interpreter's own start-up, measured in the same rounds):

- the cold time of `penrose check`, `fmt`, `plan` and `render` (to SVG) on one zoo file: a fresh
  `python -m penrose` process each run, the median of the runs, the commands taken in turn each
  round so that a busy machine slows them all alike;
- which heavy libraries each command imported (torch must not be one);
- statements per second for parse and for check, each timed alone (the median of a few
  repeats) on generated statements like `h3 = relu(einsum('te,ed->td', h2, W)) + h2  # step`.

Targets (issue 11): a cold `penrose check` under 0.3 s, no torch in check, fmt, plan or render,
and parse + check at least 10,000 statements a second. By default the script only reports; with
--strict it exits 1 when a target is missed (timings on a shared machine vary: compare with the
`python -c pass` line).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHECK_TARGET_S = 0.3
STATEMENTS_TARGET = 10_000  # statements a second, parse and check together
HEAVY = ("torch", "lark", "matplotlib", "graphviz", "networkx", "numpy", "opt_einsum")

# Runs `python -m penrose ARGS` in this process and prints, last, which heavy libraries it imported.
_WRAPPER = """\
import json, runpy, sys
sys.argv = ["penrose"] + sys.argv[1:]
try:
    runpy.run_module("penrose", run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code
else:
    code = 0
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(%r))
print("\\n" + json.dumps({"heavy": heavy, "code": code if isinstance(code, int) else 1}), file=sys.stderr)
""" % (HEAVY,)


def commands(file: str, svg: str) -> dict[str, list[str]]:
    return {
        "check": ["check", file],
        "fmt": ["fmt", file],
        "plan": ["plan", file],
        "render": ["render", file, "-o", svg],
    }


def _env() -> dict:
    # the checkout's penrose, whatever is installed
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}


def cold_times(cmds: dict[str, list[str]], runs: int) -> dict[str, float]:
    """The median wall time of a fresh process for each command, and for `python -c pass`."""
    argv = {"python -c pass": [sys.executable, "-c", "pass"]}
    argv.update({f"penrose {name}": [sys.executable, "-m", "penrose", *args] for name, args in cmds.items()})
    times: dict[str, list[float]] = {name: [] for name in argv}
    env = _env()
    for round_ in range(runs + 1):  # the first round warms the disk cache and is not counted
        for name, a in argv.items():
            start = time.perf_counter()
            run = subprocess.run(a, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            elapsed = time.perf_counter() - start
            if run.returncode != 0:
                raise SystemExit(f"{name} failed ({run.returncode}):\n{run.stderr[-2000:]}")
            if round_:
                times[name].append(elapsed)
    return {name: statistics.median(t) for name, t in times.items()}


def imported(cmds: dict[str, list[str]]) -> dict[str, list[str]]:
    """The heavy libraries each command imports (one run each, through a wrapper)."""
    out = {}
    for name, args in cmds.items():
        run = subprocess.run([sys.executable, "-c", _WRAPPER, *args], cwd=ROOT, env=_env(), capture_output=True, text=True)
        report = json.loads(run.stderr.strip().splitlines()[-1])
        if report["code"] != 0:
            raise SystemExit(f"penrose {name} failed:\n{run.stderr[-2000:]}")
        out[name] = report["heavy"]
    return out


def statements(n: int) -> str:
    """A diagram of n statements, each a residual step with an einsum and a note."""
    lines = ["dim t = 4, e = 8", "input h0[t, e]", "param W[e, e]"]
    lines += [f"h{i} = relu(einsum('te,ed->td', h{i - 1}, W)) + h{i - 1}  # step" for i in range(1, n + 1)]
    return "\n".join(lines + [f"output h{n}"]) + "\n"


def throughput(n: int, repeats: int) -> tuple[float, float]:
    """Seconds to parse, and to check, n statements (each the median of `repeats`)."""
    from penrose.checker import check
    from penrose.parser import parse

    text = statements(n)
    parse_s, check_s = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        d = parse(text)
        mid = time.perf_counter()
        check(d)
        parse_s.append(mid - start)
        check_s.append(time.perf_counter() - mid)
    return statistics.median(parse_s), statistics.median(check_s)


def main(argv=None) -> int:
    small_default = os.environ.get("PENROSE_REDUCED", "") not in ("", "0")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", default="zoo/paper/self_attention.pen", help="the diagram the commands run on")
    ap.add_argument("--runs", type=int, help="cold runs per command (default 9, 3 with --small)")
    ap.add_argument("--statements", type=int, help="generated statements (default 10,000, 2,000 with --small)")
    ap.add_argument("--small", action="store_true", default=small_default, help="fewer runs and statements")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args(argv)
    runs = args.runs or (3 if args.small else 9)
    n = args.statements or (2_000 if args.small else 10_000)

    with tempfile.TemporaryDirectory() as tmp:
        cmds = commands(args.file, os.path.join(tmp, "figure.svg"))
        cold = cold_times(cmds, runs)
        heavy = imported(cmds)
    base = cold["python -c pass"]

    print(f"cold start, median of {runs} runs ({args.file}):")
    print(f"  {'python -c pass':<16} {base:6.3f} s")
    for name in cmds:
        t = cold[f"penrose {name}"]
        libs = ", ".join(heavy[name]) or "none"
        print(f"  {'penrose ' + name:<16} {t:6.3f} s  (+{t - base:.3f} s over python)  imports: {libs}")

    parse_s, check_s = throughput(n, repeats=3 if args.small else 5)
    both = n / (parse_s + check_s)
    print(f"{n:,} statements (median of {3 if args.small else 5}):")
    print(f"  parse {parse_s:6.3f} s  {n / parse_s:9,.0f} statements/s")
    print(f"  check {check_s:6.3f} s  {n / check_s:9,.0f} statements/s")
    print(f"  both  {parse_s + check_s:6.3f} s  {both:9,.0f} statements/s")

    missed = []
    if cold["penrose check"] >= CHECK_TARGET_S:
        missed.append(f"cold penrose check {cold['penrose check']:.3f} s (target < {CHECK_TARGET_S} s)")
    missed += [f"penrose {name} imports torch" for name in cmds if "torch" in heavy[name]]
    if both < STATEMENTS_TARGET:
        missed.append(f"parse + check {both:,.0f} statements/s (target >= {STATEMENTS_TARGET:,})")
    print("targets: " + ("all met" if not missed else "missed: " + "; ".join(missed)))
    return 1 if missed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
