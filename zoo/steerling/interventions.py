"""Steerling's known concepts as an intervention target: the zoo's intervention policies,
strategies and curves (`penrose_zoo.interventions`) on a concept language model.

    target = KnownConcepts(model, concepts=[3, 7, 11], names=["cats", "code", "sea"])
    curve = intervention_curve(target, (ids, c, next_token), UncertaintyPolicy(), sequential=True)

Index legend: n example (a token sequence), t position, v vocabulary, e embedding, k concept of
the target (a chosen subset of the known concepts, in the given order).

The task is the next token at one position of each sequence (`position`, default the last):
data are (ids [n, t], c [n, k] concept labels 0/1 of each sequence, y [n] the token that follows
position). An intervention sets a known concept's post-top-k weight at that position — what
`Steerling.forward`'s `intervene_known` does there — to the strategy's value (a label 1 gives
`active_value`, default 1.0; a label 0 gives 0.0, the concept switched off).

How it is computed (the ConceptLM protocol of penrose_zoo.steerling.attribution): one pass with a
no-op known edit (`steer.null_intervention_kwargs`), so ε is off as under every known-concept
intervention (the release's rule) and the curve's fraction 0 differs from its other points by
the concept values alone. With ε off the LM head reads û + k̂ and has no bias, so setting the
weights w → w' at the position moves the logits by Σ_k (w'_k − w_k) K_k Wᵀ (K the concept
embeddings, W the LM head); the target applies that edit to the pass's logits. It is the model's
own intervention (tests/steerling/test_zoo_steerling_interventions.py checks it against `forward` with
per-example `intervene_known` values) and differentiable in the values, so the gradient policy
works. The pass is cached for the last input tensor (a curve reads the same ids at every
fraction).

Concept scores (`c_logit`) are the known head's clamped logits at the position (before top-k);
`concept_probabilities` their sigmoid, what the uncertainty policy ranks.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence, cast

import torch
from torch import Tensor

from penrose_zoo.interventions import InterventionTarget
from penrose_zoo.steerling.attribution import ConceptLM, forward_ids
from penrose_zoo.steerling.losses import get_field
from penrose_zoo.steerling.steer import current_weights, null_intervention_kwargs

__all__ = ["KnownConcepts", "KnownConceptOutputs"]


class KnownConceptOutputs(NamedTuple):
    """Next-token logits at the position [n, v], the known weights there after interventions
    [n, k], the known head's logits there [n, k]."""

    y: Tensor
    c: Tensor
    c_logit: Tensor


class KnownConcepts(InterventionTarget):
    """A Steerling model (any ConceptLM) seen as a concept model over `concepts` (known-concept
    ids; default all), for `penrose_zoo.interventions`. `names`: one per concept (default
    'known<id>'); `position`: the position whose next token is the task (default −1);
    `active_value`: the weight a label 1 sets."""

    def __init__(self, model: torch.nn.Module, concepts: Sequence[int] | None = None, names: Sequence[str] | None = None,
                 position: int = -1, active_value: float = 1.0) -> None:
        super().__init__()
        from penrose_zoo.validate import number, whole

        n_known = int(cast(ConceptLM, model).concept_embeddings("known").shape[0])
        ids = (list(range(n_known)) if concepts is None
               else [whole(c, f"concepts[{i}]") for i, c in enumerate(concepts)])  # (not 2.7, not "3")
        if not ids:
            raise ValueError("KnownConcepts needs at least one known concept")
        bad = [c for c in ids if not 0 <= c < n_known]
        if bad or len(set(ids)) != len(ids):
            raise ValueError(f"concepts must be distinct known-concept ids in 0..{n_known - 1}, got {ids}")
        names = tuple(f"known{c}" for c in ids) if names is None else tuple(names)
        if len(names) != len(ids):
            raise ValueError(f"{len(names)} names for {len(ids)} concepts")
        self.model = model
        self.concept_ids = ids
        self.concept_names = names
        self.sizes = {"k": len(ids)}
        if not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
            raise ValueError(f"names must be distinct non-empty strings, got {list(names)}")
        self.position = whole(position, "position")
        self.active_value = number(active_value, "active_value")  # (a NaN weight would set concepts to NaN)
        self._cache: tuple[Tensor, int, Any] | None = None
        self.training = False

    def train(self, mode: bool = True) -> "KnownConcepts":
        """The flag only: the language model keeps its own mode (each pass runs it in eval mode)."""
        self.training = mode
        return self

    def bottleneck_values(self, c: Tensor) -> Tensor:
        return torch.where(c > 0.5, torch.full_like(c, self.active_value), torch.zeros_like(c))

    @torch.no_grad()
    def _pass(self, ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(logits [n, v], weights [n, k], known logits [n, k], directions K Wᵀ [k, v]) at the
        position, from the null-edit pass (ε off), cached for the last ids tensor."""
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point():
            raise TypeError(f"KnownConcepts reads token ids [n, t], got "
                            f"{tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__}")
        if self._cache is None or self._cache[0] is not ids or self._cache[1] != ids._version:
            was = self.model.training
            self.model.eval()
            try:
                plain = forward_ids(cast(ConceptLM, self.model), ids)
                out = forward_ids(cast(ConceptLM, self.model), ids, **null_intervention_kwargs(plain))
            finally:
                self.model.train(was)
            p = self.position
            logits = get_field(out, "logits")[:, p].float()
            weights = current_weights(out, "known", self.concept_ids)[:, p].float()
            known_logits = get_field(out, "known_logits")[:, p][:, self.concept_ids].float()
            select = torch.tensor(self.concept_ids, device=ids.device)
            lm = cast(ConceptLM, self.model)
            directions = lm.concept_embeddings("known", select).float() @ lm.lm_head_weight().float().T
            self._cache = (ids, ids._version, (logits, weights, known_logits, directions))
        return self._cache[2]

    def forward(self, x: Tensor, c_true: Tensor | None = None, do: Tensor | None = None) -> KnownConceptOutputs:
        logits, w, known_logits, directions = self._pass(x)
        if do is None:
            return KnownConceptOutputs(logits, w, known_logits)
        if c_true is None:
            raise ValueError("an intervention mask 'do' needs the values 'c_true' to set")
        c = torch.where(do.to(w.device), c_true.to(w.device, w.dtype), w)
        return KnownConceptOutputs(logits + (c - w) @ directions, c, known_logits)
