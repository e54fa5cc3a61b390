"""The concept heads' pieces on their own: the blocked top-k (zoo/steerling/blocked.py) and the
output record's top-k fields (zoo/steerling/outputs.py), including the records they refuse."""

from __future__ import annotations

import pytest
import torch

from penrose_zoo.steerling.blocked import CLAMP, select_topk
from penrose_zoo.steerling.outputs import SteerlingOutput


@pytest.mark.parametrize("by_sigmoid", [False, True])
def test_select_topk_in_blocks_is_the_dense_topk(by_sigmoid):
    g = torch.Generator().manual_seed(0)
    x, predictor = torch.randn(2, 5, 4, generator=g), torch.randn(11, 4, generator=g)
    logits, ids = select_topk(x, predictor, 3, block=4, by_sigmoid=by_sigmoid)
    dense = (x @ predictor.T).clamp(-CLAMP, CLAMP)
    want = dense.topk(3, dim=-1)
    assert torch.equal(ids, want.indices)
    torch.testing.assert_close(logits, want.values)


def test_select_topk_of_a_predictor_without_concepts_is_a_value_error():
    """Regression: no concepts left the running top-k unset (AttributeError on None)."""
    with pytest.raises(ValueError, match=r"no concepts \(shape \(0, 4\)\)"):
        select_topk(torch.randn(3, 4), torch.empty(0, 4), 2)


def _record(**fields) -> SteerlingOutput:
    t = torch.zeros(2, 3)
    return SteerlingOutput(logits=t, hidden=t, known_features=t, unknown_features=t, epsilon=None, composed=t, **fields)


def test_the_topk_fields_are_read_off_dense_logits():
    known = torch.tensor([[0.5, -1.0, 2.0, 0.0]])
    out = _record(known_logits=known, unknown_logits=-known, topk_known=2, topk_unknown=1)
    assert out.known_topk_indices.tolist() == [[2, 0]]
    assert out.known_topk_logits.tolist() == [[2.0, 0.5]]
    assert out.unknown_topk_indices.tolist() == [[1]]
    assert out.unknown_topk_logits.tolist() == [[1.0]]


def test_a_record_without_logits_or_topk_says_which_fields_it_lacks():
    """Regression: a record built with neither dense logits nor a blocked head's top-k failed
    with AttributeError on None; it now names the missing fields."""
    out = _record()
    with pytest.raises(ValueError, match="neither known_top nor known_logits"):
        _ = out.known_topk_indices
    with pytest.raises(ValueError, match="neither unknown_logits nor unknown_select"):
        _ = out.unknown_topk_indices
    with pytest.raises(ValueError, match="neither unknown_top nor unknown_logits"):
        _ = out.unknown_topk_logits
