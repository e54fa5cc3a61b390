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


def _own_rows(path):
    """A set of one's own: 200 rows, 4 features, 3 concepts, a binary task of two of them."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    c = (x[:, :3] > 0).astype(np.float32)
    np.savez(path, x=x, c=c, y=(c[:, 0] * c[:, 1]).astype(np.int64))
    return x, c


def test_pyc_bench_runs_small(tmp_path):
    """A toy set (`--sets`) and one of one's own (`--data FILE.npz`, named by the file) side by
    side in one run."""
    _own_rows(tmp_path / "mine.npz")
    env = {**os.environ, "PENROSE_REDUCED": "1"}
    run = subprocess.run([sys.executable, "bench/pyc.py", "--sets", "checkmark", "--data", str(tmp_path / "mine.npz"),
                          "--epochs", "3", "--rows", "200"],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    for name in ("checkmark", "mine"):
        rows = [line.split() for line in run.stdout.splitlines() if line.startswith(name + " ")]
        libs = {(r[1], r[2]) for r in rows}
        assert {("cbm", "penrose"), ("cbm_int", "penrose"), ("cem", "penrose"), ("hybrid", "penrose")} <= libs, name
        for r in rows:
            acc, concept, score, seconds, most = map(float, r[3:8])
            assert 0 <= acc <= 1 and 0 <= concept <= 1 and 0 <= score <= 1 and 0 <= seconds <= most
            assert len(r[8:]) == 4  # the curve: 0..3 of the 3 concepts set
        if importlib.util.find_spec("torch_concepts") is not None:
            assert {("cbm", "pyc"), ("cem", "pyc")} <= libs, name
    if importlib.util.find_spec("torch_concepts") is not None:
        assert re.search(r"training speed-up over PyC \(toy heads\): min [\d.]+×", run.stdout)
        # the floor: the same CBM written directly in torch, timed beside PyC's
        assert re.search(r"PyC / hand-written torch loop: [\d.]+× \([\d.]+ s\)", run.stdout)
        assert re.search(r"PyC / the zoo through autograd: [\d.]+× \([\d.]+ s\)", run.stdout)
    else:
        assert "PyC (torch_concepts) is not installed" in run.stdout


def test_pyc_bench_names_a_file_that_does_not_fit(tmp_path):
    """`--data` with a file that lacks an array: named, and the run stops with status 2."""
    import numpy as np

    x, c = _own_rows(tmp_path / "mine.npz")
    np.savez(tmp_path / "bad.npz", x=x, c=c)
    run = subprocess.run([sys.executable, "bench/pyc.py", "--data", str(tmp_path / "bad.npz")], cwd=ROOT,
                         capture_output=True, text=True, env={**os.environ, "PENROSE_REDUCED": "1"}, timeout=600)
    assert run.returncode == 2 and "bad.npz: no array 'y'" in run.stderr, run.stderr
