"""The record one Steerling forward pass returns (`SteerlingOutput`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TypeVar

import torch
from torch import Tensor

_T = TypeVar("_T")


def _given(value: _T | None, missing: str) -> _T:
    """`value`, or a ValueError saying what a record built without it lacks."""
    if value is None:
        raise ValueError(f"this SteerlingOutput has {missing}")
    return value


@dataclass
class SteerlingOutput:
    """Everything one forward pass yields. Shapes: (b, t, ·) for batched ids, (t, ·) otherwise.

    known_* / unknown_*: clamped logits (·, n) and weights (·, n) after top-k and interventions,
    features k̂, û (·, e). A large head (blocked) has no dense logits or weights (None).
    epsilon is None when ε is off (config, or a known-concept intervention); composed is what the
    LM head reads. The top-k ids, logits and weights (·, k) — known_topk_indices, ...,
    unknown_topk_weights — come from the blocked head, or are read off the logits on first
    access, ranked as the release ranks them (σ(logit) for dense heads, the logit for the
    factorised unknown head), in descending order, before interventions.
    """

    logits: Tensor
    hidden: Tensor
    known_features: Tensor
    unknown_features: Tensor
    epsilon: Tensor | None
    composed: Tensor
    known_logits: Tensor | None = None
    known_weights: Tensor | None = None
    unknown_logits: Tensor | None = None
    unknown_weights: Tensor | None = None
    topk_known: int = 1
    topk_unknown: int = 1
    known_intervened: bool = False
    unknown_intervened: bool = False
    known_large: bool = False
    unknown_large: bool = True
    unknown_by_sigmoid: bool = False  # a dense (not factorised) unknown head ranks by σ(logit)
    known_top: tuple[Tensor, Tensor] | None = None  # (logits, ids) from a blocked head
    unknown_top: tuple[Tensor, Tensor] | None = None
    unknown_select: Callable[[int], tuple[Tensor, Tensor]] | None = None  # k -> top-k of a blocked unknown head
    known_active: tuple[Tensor, Tensor] | None = None  # (ids, weights) a blocked head's features are built from
    unknown_active: tuple[Tensor, Tensor] | None = None

    @functools.cached_property
    def known_topk_indices(self) -> Tensor:
        if self.known_top is not None:
            return self.known_top[1]
        return torch.sigmoid(self._known_logits()).topk(self.topk_known, dim=-1).indices

    @functools.cached_property
    def known_topk_logits(self) -> Tensor:
        if self.known_top is not None:
            return self.known_top[0]
        return self._known_logits().gather(-1, self.known_topk_indices)

    @functools.cached_property
    def known_topk_weights(self) -> Tensor:
        return torch.sigmoid(self.known_topk_logits)

    def _known_logits(self) -> Tensor:
        return _given(self.known_logits, "neither known_top nor known_logits")

    def _unknown_select(self) -> Callable[[int], tuple[Tensor, Tensor]]:
        return _given(self.unknown_select, "neither unknown_logits nor unknown_select")

    def _unknown_ranked(self, k: int) -> Tensor:
        if self.unknown_logits is None:  # a blocked head: ranked block by block
            return self._unknown_select()(k)[1]
        rank = torch.sigmoid(self.unknown_logits) if self.unknown_by_sigmoid else self.unknown_logits
        return rank.topk(min(k, rank.shape[-1]), dim=-1).indices

    @functools.cached_property
    def unknown_topk_indices(self) -> Tensor:
        if self.unknown_top is not None:
            return self.unknown_top[1]
        return self._unknown_ranked(self.topk_unknown)

    @functools.cached_property
    def unknown_topk_logits(self) -> Tensor:
        if self.unknown_top is not None:
            return self.unknown_top[0]
        logits = _given(self.unknown_logits, "neither unknown_top nor unknown_logits")
        return logits.gather(-1, self.unknown_topk_indices)

    @functools.cached_property
    def unknown_topk_weights(self) -> Tensor:
        return torch.sigmoid(self.unknown_topk_logits)

    def as_release(self, unknown_topk: int = 64) -> dict[str, Tensor | None]:
        """The release's `InterpretableOutput` fields (None where the release gives None).
        `unknown_topk`: the release's forward argument, the size of the attribution list it
        reports when a small unknown head was intervened on (its dense path gives no top-k)."""
        kf, uf, h = self.known_features, self.unknown_features, self.hidden
        u_idx, u_log = self.unknown_topk_indices, self.unknown_topk_logits
        if self.unknown_intervened and not self.unknown_large:  # the release's attribution top-k
            if self.unknown_logits is None:
                u_log, u_idx = self._unknown_select()(unknown_topk)
            else:
                u_idx = self._unknown_ranked(unknown_topk)
                u_log = self.unknown_logits.gather(-1, u_idx)
        return {
            "hidden": h,
            "known_features": kf,
            "known_logits": None if self.known_large else self.known_logits,
            "known_gt_features": None,
            "known_predicted": kf,
            "known_weights": None if self.known_large else self.known_weights,
            "known_topk_indices": None if self.known_intervened and not self.known_large else self.known_topk_indices,
            "known_topk_logits": None if self.known_intervened and not self.known_large else self.known_topk_logits,
            "unk": h - kf,
            "unk_hat": uf,
            "unk_for_lm": uf if self.epsilon is None else uf + self.epsilon,
            "unknown_logits": None if self.unknown_large else self.unknown_logits,
            "unknown_weights": None if self.unknown_large else self.unknown_weights,
            "unknown_topk_indices": u_idx,
            "unknown_topk_logits": u_log,
            "composed": self.composed,
            "epsilon": self.epsilon,
            "epsilon_true": h - (kf + uf),
        }


OUTPUT_FIELDS = tuple(f.name for f in fields(SteerlingOutput)) + tuple(
    f"{head}_topk_{what}" for head in ("known", "unknown") for what in ("indices", "logits", "weights"))
