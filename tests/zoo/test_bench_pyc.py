"""bench/pyc.py runs in a tiny form: the zoo's side always, PyC's where torch_concepts is installed
(its `pyc` extra), and each row carries task and concept accuracy, the intervention score and the
training time."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_pyc_bench_runs_small():
    env = {**os.environ, "PENROSE_REDUCED": "1"}
    run = subprocess.run([sys.executable, "bench/pyc.py", "--sets", "checkmark", "--epochs", "3", "--rows", "200"],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = [line.split() for line in run.stdout.splitlines() if line.startswith("checkmark")]
    libs = {(r[1], r[2]) for r in rows}
    assert {("cbm", "penrose"), ("cbm_int", "penrose"), ("cem", "penrose"), ("hybrid", "penrose")} <= libs
    for r in rows:
        acc, concept, score, seconds = map(float, r[3:7])
        assert 0 <= acc <= 1 and 0 <= concept <= 1 and 0 <= score <= 1 and seconds >= 0
        assert len(r[7:]) == 4  # the curve: 0..3 of checkmark's 3 concepts set
    if importlib.util.find_spec("torch_concepts") is not None:
        assert {("cbm", "pyc"), ("cem", "pyc")} <= libs
        assert re.search(r"training speed-up over PyC: min [\d.]+×", run.stdout)
        # the floor: the same CBM written directly in torch, timed beside PyC's
        assert re.search(r"PyC / hand-written torch loop: [\d.]+× \([\d.]+ s\)", run.stdout)
        assert re.search(r"PyC / the zoo through autograd: [\d.]+× \([\d.]+ s\)", run.stdout)
    else:
        assert "PyC (torch_concepts) is not installed" in run.stdout


def test_pyc_bench_runs_on_ones_own_rows(tmp_path):
    """`--data FILE.npz`: a set of one's own rows, named by the file, side by side as the toy
    sets are; a file that does not fit is named and the run stops with status 2."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    c = (x[:, :3] > 0).astype(np.float32)
    np.savez(tmp_path / "mine.npz", x=x, c=c, y=(c[:, 0] * c[:, 1]).astype(np.int64))
    env = {**os.environ, "PENROSE_REDUCED": "1"}
    run = subprocess.run([sys.executable, "bench/pyc.py", "--data", str(tmp_path / "mine.npz"), "--epochs", "3",
                          "--models", "cbm", "cem"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = [line.split() for line in run.stdout.splitlines() if line.startswith("mine ")]
    libs = {(r[1], r[2]) for r in rows}
    assert {("cbm", "penrose"), ("cem", "penrose")} <= libs and not any(line.startswith("xor") for line in run.stdout.splitlines())
    for r in rows:
        assert len(r[7:]) == 4  # the curve: 0..3 of its 3 concepts set
    if importlib.util.find_spec("torch_concepts") is not None:
        assert {("cbm", "pyc"), ("cem", "pyc")} <= libs
    np.savez(tmp_path / "bad.npz", x=x, c=c)
    run = subprocess.run([sys.executable, "bench/pyc.py", "--data", str(tmp_path / "bad.npz")], cwd=ROOT,
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 2 and "bad.npz: no array 'y'" in run.stderr, run.stderr
