"""Element-wise alignment never guesses a size (issue 23, docs/language.md "Element-wise arithmetic").

Legs of different names aligned by position (`a[s] + b[m]`, both with one leg) are allowed only
when both sizes are already known and equal, and reported as a warning naming both legs and the
fix; a leg of unknown size is never bound that way: the checker refuses it at the operand.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

import penrose
from penrose.errors import PenroseCheckError

PROTOPNET = """\
dim s
dim m = 3
input zz[s]
input pp[m]
input zp[s, m]
dist = zz + pp - 2 * zp
output dist
"""

OUTER = PROTOPNET.replace("dist = zz + pp", "dist = repeat(zz, 's -> s m') + pp")

PAPER_FORM = "# index legend: t token, e embedding, d hidden\ndim t = 2, e = 3, d = 3\ninput Z[t, e]\ninput h[t, d]\nZ = Z + h\noutput Z\n"


def test_protopnet_distances_are_refused_not_bound_to_three():
    """`zz[s] + pp[m]` quietly fixed s = 3 (the numbers off by up to 6, a 5-patch input
    refused later); now the checker refuses it at pp, naming both legs and the fix."""
    with pytest.raises(PenroseCheckError) as e:
        penrose.load(PROTOPNET)
    msg = str(e.value)
    assert "leg 'm' of 'pp' with leg 's' of 'zz' by position" in msg
    assert "size of 's', which is not known" in msg and "repeat(" in msg and "einsum" in msg
    assert "state the result's legs, as dist[s, m] = ..." in msg  # issue 41: the form that says it
    assert (e.value.span.line, e.value.span.col) == (6, 13)


def test_the_outer_sum_written_with_stated_legs():
    """The hint's form works: `dist[s, m] = zz + pp - 2 * zp`, s sized only by the inputs."""
    text = PROTOPNET.replace("dist = zz", "dist[s, m] = zz")
    m = penrose.compile(text)
    for n in (5, 2):
        zz, pp, zp = torch.randn(n), torch.randn(3), torch.randn(n, 3)
        want = zz[:, None] + pp[None, :] - 2 * zp
        torch.testing.assert_close(m(zz, pp, zp), want)
        torch.testing.assert_close(penrose.interpret(text, zz, pp, zp), want)


def test_the_outer_sum_written_by_name():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = penrose.compile(OUTER)
    zz, pp, zp = torch.randn(5), torch.randn(3), torch.randn(5, 3)
    want = zz[:, None] + pp[None, :] - 2 * zp
    torch.testing.assert_close(m(zz, pp, zp), want)
    torch.testing.assert_close(penrose.interpret(OUTER, zz, pp, zp), want)


@pytest.mark.parametrize("text", [
    "dim s\ndim m = 3\ninput a[s]\ninput b[m]\ny = b * a\noutput y",  # the unknown leg on either side
    "dim s, m\ninput a[s]\ninput b[m]\ny = a - b\noutput y",  # both unknown
    "dim s\ndim m = 3\ninput a[s]\ninput b[m]\nmask = a > 0\ny = where(mask, a, b)\noutput y",
    "dim s\ndim m = 3\nblock f(a[s], b[m]) {\n  y = a + b\n  return y\n}\ninput x[m]\ny = f(x, x)\noutput y",
])
def test_no_size_is_bound_by_position(text):
    with pytest.raises(PenroseCheckError, match="by position and so fix the size"):
        penrose.load(text)


def test_known_equal_sizes_align_by_position_with_a_warning():
    """The paper's `Z = Z + h` (Z[t, e], h[t, d], e = d = 3) still means what PyTorch does, and
    says so: a warning naming both legs and the fix."""
    checked = penrose.load(PAPER_FORM)
    (msg, span), = [w for w in checked.warnings if "by position" in w[0]]
    assert "leg 'd' of 'h' with leg 'e' of 'Z' by position (sizes 3 and 3)" in msg
    assert "rename one leg" in msg and "einsum" in msg
    assert (span.line, span.col) == (5, 9)
    Z, h = torch.randn(2, 3), torch.randn(2, 3)
    torch.testing.assert_close(penrose.compile(PAPER_FORM)(Z, h), Z + h)


def test_different_known_sizes_are_a_size_conflict():
    with pytest.raises(PenroseCheckError, match="size conflict"):
        penrose.load("dim s = 2, m = 3\ninput a[s]\ninput b[m]\ny = a + b\noutput y")


def test_the_warning_reaches_the_cli(tmp_path):
    f = tmp_path / "paper.pen"
    f.write_text(PAPER_FORM)
    run = subprocess.run([sys.executable, "-m", "penrose.cli", "check", str(f)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0
    assert f"{f}:5:9: warning: '+' aligns leg 'd' of 'h' with leg 'e' of 'Z' by position" in run.stderr + run.stdout


def test_the_warning_reaches_the_magic_and_serve(tmp_path):
    from penrose.magic import run_cell
    from penrose.serve import Live

    shown = []
    run_cell("--no-figure", PAPER_FORM, {}, shown.append)
    assert "warning: '+' aligns leg 'd' of 'h' with leg 'e' of 'Z' by position" in repr(shown[0])
    f = tmp_path / "paper.pen"
    f.write_text(PAPER_FORM)
    live = Live(f, key="k")
    _, found = live._check()
    assert any("aligns leg 'd' of 'h' with leg 'e' of 'Z' by position" in m for m, _ in found)
