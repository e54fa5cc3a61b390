"""The run-time helpers of generated modules (penrose/runtime.py), one by one, against torch.

Standalone source carries their text from the marker line on; in-memory modules import them.
"""

from __future__ import annotations

import pytest
import torch

import penrose
from penrose import runtime as R
from penrose.errors import PenroseShapeError


def test_masks():
    t = torch.arange(5)
    assert torch.equal(R._causal_mask(5, 5, None), t[None, :] <= t[:, None])
    want = (t[None, :] // 2) <= (t[:, None] // 2)
    assert torch.equal(R._block_causal_mask(5, 5, 2, None), want)
    assert R._block_causal_mask(5, 5, 2, None)[0, 1]  # bidirectional inside a block


def test_topk_helpers():
    x = torch.tensor([[3.0, -1.0, 2.0, 0.5]])
    assert R._topk_filter(x, 2, -1).tolist() == [[3.0, 0.0, 2.0, 0.0]]
    assert R._topk_mask(x, 2, -1).tolist() == [[True, False, True, False]]
    assert torch.allclose(R._topk_keep(x, 2, -1, torch.sigmoid), torch.where(R._topk_mask(x, 2, -1), torch.sigmoid(x), 0.0))


def test_rms_norm_and_rope_against_formulas():
    x = torch.randn(3, 4, 8)  # computed in float32 (as the Steerling release does), cast back
    w = torch.randn(8)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(R._rms_norm(x, w, 1e-6, -1), want)
    # rotate-half: entry i pairs with i + n/2, position p turns it by p * base**(-2i/n)
    q = torch.randn(4, 8)
    n, base = 8, 10000.0
    inv = 1.0 / base ** (torch.arange(0, n, 2).float() / n)
    ang = torch.arange(4).float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    rot = torch.cat([-q[:, n // 2:], q[:, : n // 2]], -1)
    torch.testing.assert_close(R._rope(q, -2, -1, base), q * cos + rot * sin)


def test_concat_broadcasts_batch_legs():
    a, b = torch.randn(2, 3, 4), torch.randn(3, 5)
    got = R._concat([a, b], -1, 2)
    torch.testing.assert_close(got, torch.cat([a, b.expand(2, 3, 5)], -1))


def test_check_inputs_messages():
    spec = (("x", ("t", "e"), ("t", 3), "float"), ("ids", ("t",), ("t",), "int"))
    assert R._check_inputs(spec, (torch.ones(4, 3), torch.zeros(4, dtype=torch.long)), {}) == {"t": 4}
    with pytest.raises(PenroseShapeError, match="input 'x' leg 'e' must have size 3, got 2"):
        R._check_inputs(spec, (torch.ones(4, 2), torch.zeros(4, dtype=torch.long)), {})
    with pytest.raises(PenroseShapeError, match="input 'ids' leg 't' has size 5 but input 'x' gave it size 4"):
        R._check_inputs(spec, (torch.ones(4, 3), torch.zeros(5, dtype=torch.long)), {})
    with pytest.raises(PenroseShapeError, match="must hold integer ids"):
        R._check_inputs(spec, (torch.ones(4, 3), torch.zeros(4)), {})
    with pytest.raises(PenroseShapeError, match="unexpected input"):
        R._check_inputs(spec, (torch.ones(4, 3), torch.zeros(4, dtype=torch.long)), {"y": 1})
    ref = torch.nn.Parameter(torch.ones(1))
    with pytest.raises(PenroseShapeError, match="input 'x' is torch.float64 but the model's parameters are torch.float32"):
        R._check_inputs(spec, (torch.ones(4, 3, dtype=torch.float64), torch.zeros(4, dtype=torch.long)), {}, (), ref)


def test_standalone_source_carries_the_helpers_and_imports_only_torch():
    src = penrose.source("zoo/self_attention.pen")
    assert "def _check_inputs(" in src and "from penrose" not in src and "import penrose" not in src
    ns: dict = {}
    exec(compile(src, "standalone.py", "exec"), ns)  # the test runs generated source; the library never does
    model = ns["Model"]()
    compiled = penrose.compile("zoo/self_attention.pen")
    compiled.load_state_dict(model.state_dict())
    z = torch.randn(*[s for _, s in _input_shape(model)])
    torch.testing.assert_close(tuple(model(z)), tuple(compiled(z)))


def _input_shape(model):
    (_, legs, sizes, _), = model._INPUTS
    return [(leg, s if isinstance(s, int) else 4) for leg, s in zip(legs, sizes)]
