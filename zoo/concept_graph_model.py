"""Concept graph models: concepts and the task as the nodes of a given directed acyclic graph, a
root concept computed from the input and every other node from its parents only
(`zoo/concept_graph_model.pen`), after Dominici et al., "Causal Concept Graph Models", ICLR 2025,
and PyC's graph concept bottleneck. `GraphConcepts` is what the graph models share (the graph's
buffers, its depth, the task as a node, the explanation); `penrose_zoo.CausallyReliableCBM` is
the other graph model built on it."""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, NamedTuple, Sequence

import torch

from penrose_zoo.concept_types import TypedConcepts
from penrose_zoo.concepts import ConceptModel
from penrose_zoo.core import Explanation

__all__ = ["ConceptGraphModel", "GraphConcepts", "graph_depth", "topological_order"]


def graph_depth(names: Sequence[str], parents: Mapping[str, Sequence[str]]) -> int:
    """The longest path (in edges) of the concept graph; raises ValueError naming an unknown
    concept or a cycle."""
    for child, ps in parents.items():
        for name in (child, *ps):
            if name not in names:
                raise ValueError(f"concept graph names {name!r}, not a concept; the concepts are {', '.join(names)}")
    depth: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> int:
        if n in path:
            cycle = path[path.index(n):] + [n]
            raise ValueError(f"the concept graph has a cycle: {' -> '.join(cycle)}")
        if n not in depth:
            depth[n] = max((visit(p, path + [n]) + 1 for p in parents.get(n, ())), default=0)
        return depth[n]

    return max((visit(n, []) for n in names), default=0)


def topological_order(names: Sequence[str], parents: Mapping[str, Sequence[str]]) -> list[str]:
    """The names, every one after its parents (ties in the given order)."""
    graph_depth(names, parents)  # (names unknown concepts and cycles)
    order: list[str] = []
    while len(order) < len(names):
        for n in names:
            if n not in order and all(p in order for p in parents.get(n, ())):
                order.append(n)
    return order


class GraphOutputs(NamedTuple):
    """A graph model's outputs: the task logits, the concept values after interventions and
    propagation, each concept column's logit from its parents' final values."""

    y: torch.Tensor
    c: torch.Tensor
    c_logit: torch.Tensor


class GraphConcepts(TypedConcepts):
    """The concept graph of a graph model (a mixin over `TypedConcepts`: binary, categorical and
    continuous concepts).

    `concepts={"A": "binary", "B": ["s", "m", "l"], "C": "continuous"}` (or `concept_names=[…]`,
    all binary), `parents={"B": ["A"], "C": ["A", "B"], "y": ["B", "C"]}`: a concept maps to the
    concepts it is computed from (roots are left out), and the task, named `task_name` ("y" by
    default), is a node too: its entry lists the concepts it reads (all of them when it has none;
    `task_parents=[…]` says the same). The task is a sink: no concept may read it. The diagram's
    buffers `root[k]`, `A[k, k]` (column i belongs to a parent of column j's concept) and
    `task_parents[k]` come from the graph, `depth` (propagation steps) from its longest path + 1.
    """

    #: the graph when none is given, over `default_concepts`: one of each kind of node
    default_parents: ClassVar[dict] = {"c2": ("c0",), "c3": ("c1", "c2")}

    def __init__(self, *, concepts: Any = None, concept_names: Sequence[str] | None = None,
                 parents: Mapping[str, Sequence[str]] | None = None, task_parents: Sequence[str] | None = None,
                 task_name: str = "y", **kwargs: Any) -> None:
        if concepts is not None and concept_names is not None:
            raise TypeError(f"{type(self).__name__} takes `concepts` (typed) or `concept_names` (binary), not both")
        if concept_names is not None:
            if isinstance(concept_names, str):
                raise TypeError(f"concept_names must be a list of names, got {concept_names!r}")
            concepts = {n: "binary" for n in concept_names}
            if len(concepts) != len(concept_names):
                raise ValueError(f"concept_names must be distinct, got {list(concept_names)}")
        if parents is None and concepts is None:
            parents = self.default_parents
        parents = {c: tuple(ps) for c, ps in (parents or {}).items()}
        if task_name in parents:
            if task_parents is not None:
                raise TypeError(f"the task {task_name!r} has parents in `parents` and in `task_parents`: give them once")
            task_parents = parents.pop(task_name)
        spec_names = list(concepts) if concepts is not None else list(self.default_concepts)
        if task_name in spec_names:
            raise ValueError(f"the task's name {task_name!r} is also a concept's; name the task with task_name=…")
        for child, ps in parents.items():
            if task_name in ps:
                raise ValueError(f"concept {child!r} reads the task {task_name!r}: the task is the graph's sink")
        depth = graph_depth(spec_names, parents) + 1  # the roots' step, then one per level
        if "depth" in kwargs and kwargs.pop("depth") != depth:
            raise TypeError(f"{type(self).__name__} takes its depth from the graph (depth = {depth}), not as a different argument")
        super().__init__(concepts=concepts, depth=depth, **kwargs)
        unknown = [n for n in (task_parents or ()) if n not in self.spec.concepts]
        if unknown:
            raise ValueError(f"the task reads {unknown[0]!r}, not a concept; the concepts are {', '.join(self.spec.concepts)}")
        self.parents = parents
        self.task_name = task_name
        self.task_parent_names = tuple(self.spec.concepts if not task_parents else task_parents)
        with torch.no_grad():
            for name, value in self.graph_buffers().items():
                getattr(self.diagram, name).copy_(value)

    def _columns(self, concept: str) -> list[int]:
        return list(self.spec.units[self.spec.concepts.index(concept)])

    def graph_buffers(self) -> dict[str, torch.Tensor]:
        """The diagram's `root[k]`, `A[k, k]` and `task_parents[k]` for the graph."""
        k = self.spec.k
        root, A, task = torch.ones(k), torch.zeros(k, k), torch.zeros(k)
        for child, ps in self.parents.items():
            for j in self._columns(child):
                root[j] = 0.0 if ps else 1.0
                for p in ps:
                    A[self._columns(p), j] = 1.0
        for n in self.task_parent_names:
            task[self._columns(n)] = 1.0
        return {"root": root, "A": A, "task_parents": task}

    def structure_buffers(self) -> dict[str, torch.Tensor]:
        """The buffers the concepts and the graph fix (types and graph): what a model's state
        carries besides what training changes."""
        return {**self.spec.buffers(), **self.graph_buffers()}

    def own_step_parts(self) -> list[str]:
        """Over binary concepts only, the typed losses are the base model's (BCE per concept,
        weighted, over the count), so the generated step covers them; a categorical or
        continuous concept trains through autograd."""
        typed = ("loss", "concept_loss", "concept_loss_terms")
        parts = super().own_step_parts()
        return [p for p in parts if p not in typed] if set(self.spec.types) == {"binary"} else parts

    def concept_parents(self, concept: str) -> tuple[str, ...]:
        """The concepts `concept` is computed from (none for a root; for the task's name, the
        task's parents)."""
        if concept == self.task_name:
            return self.task_parent_names
        return tuple(self.parents.get(concept, ()))

    def forward(self, x: Any, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> GraphOutputs:
        """The diagram's outputs (y, c, c_logit); see ConceptModel.forward."""
        return GraphOutputs(*self._run(x, c_true, do)[:3])

    def task_weights(self, x: Any, c_true: torch.Tensor | None, do: torch.Tensor | None) -> torch.Tensor:
        """[..., k, r]: what each concept column's value is multiplied by in the task's logits."""
        return (self.diagram.W_y * self.diagram.task_parents[:, None]).expand(*self.features(x).shape[:-1], -1, -1)

    def task_bias(self) -> torch.Tensor:
        return self.diagram.b_y

    def explain(self, x: torch.Tensor, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> Explanation:
        """parts[..., k, r] = c_k · (the task's weight of column k), over the task's parents; the
        details carry the graph (`A`, columns), the root columns and the concept logits."""
        out = self(x, c_true, do)
        weights = self.task_weights(x, c_true, do)
        d = self.diagram
        return Explanation(out.y, out.c[..., :, None] * weights, self.task_bias(), ("k",),
                           {"concepts": out.c, "weights": weights, "graph": d.A, "roots": d.root,
                            "concept_logits": out.c_logit, "concept_types": tuple(self.spec.column_types),
                            "concept_groups": dict(self.spec.groups)}, names=self.concept_names)


class ConceptGraphModel(GraphConcepts, ConceptModel):
    """The concept graph model of the literature: a root concept from the input, every other
    concept and the task from their parents only.

    c_j = act(x W_c[:, j] + b_c[j]) for a root column j; c_j = act(Σ_{i ∈ parents} W_p[i, j] c_i +
    b_c[j]) otherwise; y = Σ_{i ∈ task parents} c_i W_y[i, :] + b_y (act: sigmoid, the softmax
    of a categorical group, the identity of a continuous concept). As PyC's
    `GraphConceptBottleneckModel`: a linear layer per node, probabilities passed down.

    `ConceptGraphModel(f=4, r=2, concept_names=["A", "B", "C"], parents={"C": ["B"], "y": ["A",
    "C"]})`; typed concepts with `concepts={…}` (see `GraphConcepts`). An intervention on a concept
    reaches its descendants: set B, and C follows whatever the input says.

    Index legend: f input feature, k concept column, g categorical group, r task output, depth
    propagation step (the graph's longest path + 1). Outputs (y, c, c_logit: each column's logit
    from its parents' final values). Explanation: parts c_k W_y[k, r] over the task's parents,
    and the graph.

    >>> m = ConceptGraphModel(f=3, r=1, task="binary", concept_names=["A", "B"], parents={"B": ["A"], "y": ["B"]})
    >>> m.diagram.root.tolist(), m.diagram.task_parents.tolist()
    ([1.0, 0.0], [0.0, 1.0])
    """

    diagram_file = "concept_graph_model.pen"
    defaults = {"f": 2000, "k": 6, "g": 1, "r": 2, "depth": 3}  # k, g, depth: `default_concepts`' and `default_parents`'
    concept_params = ("W_c", "b_c", "W_p")
