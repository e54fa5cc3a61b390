"""Causally reliable concept bottleneck (C2BM): De Felice et al., "Causally Reliable Concept
Bottleneck Models", NeurIPS 2025, as PyC (`torch_concepts`) builds it
(`zoo/causally_reliable_cbm.pen`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from penrose_zoo.concept_graph_model import GraphConcepts
from penrose_zoo.concepts import ConceptModel

__all__ = ["CausallyReliableCBM", "C2BMOutputs"]


class C2BMOutputs(NamedTuple):
    """The task logits, the concept values, the concept logits and the task's weights [..., k, r]."""

    y: torch.Tensor
    c: torch.Tensor
    c_logit: torch.Tensor
    w_y: torch.Tensor


class CausallyReliableCBM(GraphConcepts, ConceptModel):
    """C2BM over a given concept graph (`GraphConcepts`: `concepts` or `concept_names`,
    `parents`, the task a node).

    Every concept state (column) has an embedding of the input, emb_j = x W_e[:, j] + b_e[j]. A
    root concept n decodes its states' embeddings, z_j = emb_j · W_r[n] + b_r[n]; any other concept
    mixes its parents' values with weights that its hypernetwork makes from each state's
    embedding, z_j = Σ_{i ∈ parents} c_i w_ji with w_j = relu(emb_j H_1[n] + b_1[n]) H_2[n] + b_2[n];
    c = act(z) by type; the task is a node of the same form with its own embedding (W_t, b_t)
    and hypernetwork (T_1, c_1, T_2, c_2): y_r = Σ_{i ∈ task parents} c_i w_y[i, r]. As PyC's
    `CausallyReliableConceptBottleneckModel` (hypernetwork without its stochastic bias,
    `hypernet_use_bias=False`, PyC's default).

    Index legend: f input feature, k concept column, n concept, g categorical group, e
    embedding, h hypernetwork unit, r task output, depth propagation step. Sizes: e = h = 8
    (PyC's defaults). Outputs (y, c, c_logit, w_y: the task's per-example weights).
    Explanation: parts c_k w_y[k, r] (no bias).

    >>> m = CausallyReliableCBM(f=3, r=1, task="binary", concept_names=["A", "B"], parents={"B": ["A"]})
    >>> m.diagram.node.tolist(), m.diagram.root.tolist()
    ([[1.0, 0.0], [0.0, 1.0]], [1.0, 0.0])
    """

    diagram_file = "causally_reliable_cbm.pen"
    defaults = {"f": 2000, "k": 6, "n": 4, "g": 1, "e": 8, "h": 8, "r": 2, "depth": 3}  # k, n, g, depth: the default graph's
    concept_params = ("W_e", "b_e", "W_r", "b_r", "H_1", "b_1", "H_2", "b_2")

    def __init__(self, **kwargs: Any) -> None:
        concepts = kwargs.get("concepts")
        names = kwargs.get("concept_names")
        count = len(concepts) if concepts is not None else len(names) if names is not None else len(self.default_concepts)
        if "n" in kwargs and kwargs.pop("n") != count:
            raise TypeError(f"CausallyReliableCBM takes n from its concepts (n = {count}), not as a different argument")
        super().__init__(n=count, **kwargs)

    def graph_buffers(self) -> dict[str, torch.Tensor]:
        """The graph's buffers and `node[k, n]`: column k is a state of concept n."""
        node = torch.zeros(self.spec.k, len(self.spec.concepts))
        for i, unit in enumerate(self.spec.units):
            node[list(unit), i] = 1.0
        return {**super().graph_buffers(), "node": node}

    def forward(self, x: Any, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> C2BMOutputs:
        """The diagram's outputs (y, c, c_logit, w_y); see ConceptModel.forward."""
        return C2BMOutputs(*self._run(x, c_true, do))

    def task_weights(self, x: Any, c_true: torch.Tensor | None, do: torch.Tensor | None) -> torch.Tensor:
        return self(x, c_true, do).w_y

    def task_bias(self) -> torch.Tensor:
        return torch.zeros_like(self.diagram.c_2[:1].expand(self.sizes["r"]))
