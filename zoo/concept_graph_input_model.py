"""Input-reading graph concept bottleneck: every concept reads the input *and* its parents in a
given concept graph (`zoo/concept_graph_input_model.pen`). Not the literature's graph model, where a
concept is computed from its parents only (`penrose_zoo.ConceptGraphModel`): here a set parent moves
its children only as far as their own input evidence lets it."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from penrose_zoo.concept_bottleneck_model import ConceptBottleneckOutputs
from penrose_zoo.concept_graph_model import graph_depth
from penrose_zoo.concepts import ConceptModel
from penrose_zoo.core import Explanation


class InputConceptGraphModel(ConceptModel):
    """Concepts on a directed acyclic graph, each also reading the input:
    c_j = σ(x W_c[:, j] + b_c[j] + Σ_{i ∈ parents(j)} W_p[i, j] c_i); y = (c ⊙ task_parents) W_y + b_y.

    `InputConceptGraphModel(f=4, r=2, concept_names=("A", "B", "C"), parents={"C": ["B"]},
    task_parents=["A", "C"])`: `parents` maps a concept to the concepts it is computed from
    (roots are left out); `task_parents` the concepts the task reads (default: all). An
    intervention on a concept reaches its descendants (set B, and C follows).
    Index legend: f input feature, k concept, r task output, depth propagation step (set to the
    graph's longest path). Outputs (y, c, c_logit: each concept's logit from its parents' final
    values). Explanation: parts c_k W_y[k, r] over the task's parents, and the graph `A`.
    """

    diagram_file = "concept_graph_input_model.pen"
    defaults = {"f": 2000, "k": 8, "r": 2}
    concept_params = ("W_c", "b_c", "W_p")

    def forward(self, x: Any, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> ConceptBottleneckOutputs:
        """The diagram's outputs (y, c, c_logit); see ConceptModel.forward."""
        return ConceptBottleneckOutputs(*self._run(x, c_true, do))

    def __init__(self, *, parents: Mapping[str, Sequence[str]] | None = None,
                 task_parents: Sequence[str] | None = None, concept_names: Sequence[str] | None = None, **kwargs: Any) -> None:
        k = kwargs.get("k", len(concept_names) if concept_names is not None else self.defaults["k"])
        names = tuple(concept_names) if concept_names is not None else tuple(f"c{i}" for i in range(k))
        parents = {c: tuple(ps) for c, ps in (parents or {}).items()}
        depth = max(1, graph_depth(names, parents))
        if "depth" in kwargs and kwargs.pop("depth") != depth:
            raise TypeError(f"{type(self).__name__} takes its depth from the graph (depth = {depth}), not as a different argument")
        kwargs.setdefault("k", len(names))
        super().__init__(concept_names=names, depth=depth, **kwargs)
        self.parents = parents
        self.task_parent_names = tuple(names if task_parents is None else task_parents)
        with torch.no_grad():
            self.diagram.A.zero_()
            for child, ps in parents.items():
                for p in ps:
                    self.diagram.A[names.index(p), names.index(child)] = 1.0
            mask = torch.zeros(len(names))
            for n in self.task_parent_names:
                mask[self.concept_index(n)] = 1.0
            self.diagram.task_parents.copy_(mask)

    def explain(self, x: torch.Tensor, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> Explanation:
        out = self(x, c_true, do)
        d = self.diagram
        parts = (out.c * d.task_parents)[..., :, None] * d.W_y
        return Explanation(out.y, parts, d.b_y, ("k",),
                           {"concepts": out.c, "weights": d.W_y, "graph": d.A, "parent_weights": d.W_p * d.A,
                            "concept_logits": out.c_logit}, names=self.concept_names)
