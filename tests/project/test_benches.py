"""The Steerling benchmark scripts run, in a small form, and their own correctness checks pass.

They print speed and memory ratios (the targets are read from their output, docs/steerling.md);
here only that they work is asserted: each exits 0 only when both sides of its comparison
compute the same function (bench/steerling.py, bench/steerling_memory.py) or bfloat16 stays
within the stated tolerance of float32 (bench/gpu_steerling_bf16.py, on the CPU here) — so the
scripts a GPU machine would run (bench/gpu_steerling.sh) cannot rot unseen.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    env = {**os.environ, "PENROSE_REDUCED": "1"}
    run = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return run.stdout


def test_steerling_speed_bench_runs():
    out = _run("bench/steerling.py", "--configs", "tiny", "--rounds", "2")
    assert "tiny" in out and "worst median ratio" in out and "max output diff 0.0e+00" in out


def test_steerling_memory_bench_runs():
    out = _run("bench/steerling_memory.py", "--tokens", "64", "--width", "256")
    assert "blocked: known True, unknown True" in out and "same top-k True" in out


def test_gpu_bf16_script_runs_on_the_cpu():
    out = _run("bench/gpu_steerling_bf16.py", "--device", "cpu", "--tiny")
    assert "bfloat16 vs float32" in out and "-> ok" in out


def test_plan_bench_runs_and_matches_opt_einsum():
    out = _run("bench/plan.py", "--small")  # exits 1 when a ratio exceeds 1 or a FLOP count disagrees
    assert "worst ratio to the best 1.00" in out and "FAIL" not in out


def test_cli_latency_bench_runs():
    out = _run("bench/cli_latency.py", "--small", "--runs", "1", "--statements", "300")  # reports; --strict would judge
    for line in ("python -c pass", "penrose check", "penrose fmt", "penrose plan", "penrose render", "300 statements"):
        assert line in out, out
    assert "statements/s" in out and out.rstrip().splitlines()[-1].startswith("targets: ")


def test_workspace_bench_runs_and_reparses_only_the_changed_file():
    out = _run("bench/workspace.py", "--small")
    assert "nothing changed" in out and "(1 file parsed per change, of 7)" in out


def test_compile_zoo_bench_runs_and_checks_its_sides():
    """bench/compile_zoo.py: one model, the eager backend (inductor's compilation is the slow part,
    not what can rot); it exits 1 when a compiled side's loss differs from eager."""
    out = _run("bench/compile_zoo.py", "--only", "concept_bottleneck", "--backend", "eager", "--rounds", "1")
    assert "concept_bottleneck" in out and "median ratio" in out and "FAIL" not in out


def test_figures_bench_runs_and_counts_what_it_measures(tmp_path):
    out = _run("bench/figures.py", "bench/figures/gated_where.pen", "--all")
    assert "the figures of bench/figures/gated_where.pen" in out
    assert "figures/figures-gated_where.svg " in out and "figures with something to fix: 0 of" in out
    # a folder of SVGs as it is: one with a crossing and a label on a wire
    (tmp_path / "bad.svg").write_text(
        '<svg width="200pt" height="100pt" viewBox="0 0 200 100" xmlns="http://www.w3.org/2000/svg"><g class="graph">'
        '<g class="edge"><title>a&#45;&gt;b</title><path stroke="#222" d="M10,10C10,10 190,90 190,90"/>'
        '<text x="50" y="31" font-family="Helvetica" font-size="11">leg</text></g>'
        '<g class="edge"><title>c&#45;&gt;d</title><path stroke="#222" d="M10,90C10,90 190,10 190,10"/></g></g></svg>')
    out = _run("bench/figures.py", "--svg", str(tmp_path), "--list")
    row = next(line for line in out.splitlines() if line.strip().startswith("bad.svg"))
    assert row.split()[1:4] == ["1", "1", "0"], row  # one crossing, one label crossed, no overflow
