"""Binary, categorical and continuous concepts, shared by the typed concept models.

`ConceptSpec` lays typed concepts out as bottleneck columns; `TypedConcepts` (a mixin, first
in the bases of a concept model whose diagram has the `binary[k]`, `continuous[k]` and
`member[k, g]` buffers) routes losses, probabilities, metrics, interventions and explanations by
type. The typed bottleneck, embedding model and mixture use it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from penrose_zoo.concepts import ConceptModel
from penrose_zoo.core import Explanation
from penrose_zoo.validate import number

__all__ = ["CONCEPT_TYPES", "ConceptSpec", "TypedConcepts"]


CONCEPT_TYPES = ("binary", "categorical", "continuous")


class ConceptSpec:
    """Typed concepts laid out as columns of the bottleneck.

    `ConceptSpec({"red": "binary", "size": ["small", "large"], "weight": "continuous"})`: a binary
    concept is one column (a label in {0, 1}); a categorical one, given by its values, one column
    per value (a one-hot label), named `size=small`, …; a continuous one, one column (a real label).
    Attributes: `columns` (names), `column_types`, `concepts` (names), `types` (per concept),
    `units` (per concept, its column ids), `groups` (categorical concept -> its column names).
    """

    def __init__(self, concepts: dict) -> None:
        if not concepts:
            raise ValueError("a ConceptSpec needs at least one concept")
        self.columns: list[str] = []
        self.column_types: list[str] = []
        self.concepts: list[str] = []
        self.types: list[str] = []
        self.units: list[tuple[int, ...]] = []
        self.groups: dict[str, tuple[str, ...]] = {}
        for name, kind in concepts.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"concept names must be non-empty strings, got {name!r}")
            start = len(self.columns)
            if isinstance(kind, str):
                if kind not in ("binary", "continuous"):
                    raise ValueError(f"concept {name!r}: type must be 'binary', 'continuous' or a list of "
                                     f"categorical values, got {kind!r}")
                self.columns.append(name)
                self.column_types.append(kind)
            else:
                values = [str(v) for v in kind]
                if len(values) < 2 or len(set(values)) != len(values):
                    raise ValueError(f"categorical concept {name!r} needs at least two distinct values, got {values}")
                self.columns += [f"{name}={v}" for v in values]
                self.column_types += ["categorical"] * len(values)
                self.groups[name] = tuple(f"{name}={v}" for v in values)
                kind = "categorical"
            self.concepts.append(name)
            self.types.append(kind)
            self.units.append(tuple(range(start, len(self.columns))))
        if len(set(self.columns)) != len(self.columns):
            raise ValueError(f"two concept columns share a name: {self.columns}")

    @property
    def k(self) -> int:
        return len(self.columns)

    @property
    def g(self) -> int:
        return max(1, len(self.groups))

    def buffers(self) -> dict:
        """The diagram's `binary[k]`, `continuous[k]` and `member[k, g]`."""
        binary = torch.tensor([t == "binary" for t in self.column_types], dtype=torch.float32)
        continuous = torch.tensor([t == "continuous" for t in self.column_types], dtype=torch.float32)
        member = torch.zeros(self.k, self.g)
        group_units = [u for u, t in zip(self.units, self.types) if t == "categorical"]
        for j, unit in enumerate(group_units):
            member[list(unit), j] = 1.0
        return {"binary": binary, "continuous": continuous, "member": member}


class TypedConcepts(ConceptModel):
    """Typed concepts for a concept model: put it first in the bases (`class
    TypedConceptEmbeddingModel(TypedConcepts, ConceptEmbeddingModel)`), over a diagram with the
    buffers `binary[k]`, `continuous[k]` and `member[k, g]` and the typed activation (sigmoid,
    softmax over each group, identity).

    `concepts={"red": "binary", "size": ["s", "m", "l"], "weight": "continuous"}`: one bottleneck
    column per binary or continuous concept and one per value of a categorical concept
    (`ConceptSpec`); k and g come from `concepts`. Losses by type: binary cross-entropy,
    cross-entropy over the group, mean squared error; each concept weighs once (a categorical
    group is one concept), times `concept_weight` (one number, or per concept name).
    Interventions set whole concepts: `concept_units()` gives each concept's columns, which
    `penrose_zoo.interventions` sets together; labels are 0/1, one-hot and real.
    `concept_report(data)` gives per-concept metrics by type (accuracy; accuracy over the group's
    argmax; R² and MSE). Explanations carry the column names, the types and the groups.
    """

    #: the concepts when none are given: one of each type
    default_concepts: ClassVar[dict] = {"c0": "binary", "c1": "binary", "c2": ("a", "b", "c"), "c3": "continuous"}

    def __init__(self, *, concepts: dict | ConceptSpec | None = None, concept_weight: Any = 1.0, **kwargs: Any) -> None:
        concepts = self.default_concepts if concepts is None else concepts
        spec = concepts if isinstance(concepts, ConceptSpec) else ConceptSpec(concepts)
        if "concept_names" in kwargs:
            raise TypeError(f"{type(self).__name__} takes its concept names from `concepts`, not as an argument")
        for key, value in (("k", spec.k), ("g", spec.g)):
            if key in kwargs and kwargs.pop(key) != value:
                raise TypeError(f"{type(self).__name__} takes its {key} from `concepts` ({key} = {value}), "
                                f"not as a different argument")
        if isinstance(concept_weight, dict):
            unknown = sorted(set(concept_weight) - set(spec.concepts))
            if unknown:
                raise ValueError(f"concept_weight names {unknown[0]!r}, not a concept; the concepts are {', '.join(spec.concepts)}")
            given = [concept_weight.get(n, 1.0) for n in spec.concepts]
        elif isinstance(concept_weight, (int, float)):
            given = [concept_weight] * len(spec.concepts)
        else:
            given = list(concept_weight) if not isinstance(concept_weight, str) else [concept_weight]
            if len(given) != len(spec.concepts):
                raise ValueError(f"concept_weight needs one weight per concept ({len(spec.concepts)}), got {len(given)}")
        per_concept = [number(w, f"concept_weight for {n!r}", low=0) for w, n in zip(given, spec.concepts)]
        columns = [0.0] * spec.k
        for w, unit in zip(per_concept, spec.units):
            for i in unit:
                columns[i] = w
        super().__init__(k=spec.k, g=spec.g, concept_names=tuple(spec.columns), concept_weight=columns, **kwargs)
        self.spec = spec
        column_concept = [j for j, unit in enumerate(spec.units) for _ in unit]
        self.register_buffer("_column_concept", torch.tensor(column_concept), persistent=False)
        with torch.no_grad():
            for name, value in spec.buffers().items():
                getattr(self.diagram, name).copy_(value)

    # -- types
    def random_do(self, c_true: torch.Tensor) -> torch.Tensor:
        """RandInt by concept: one draw per concept, so a categorical concept is set whole
        (`randint='example'`: one draw per example)."""
        if self.randint == "example":
            return self._example_do(c_true)
        draw = self._drawn((*c_true.shape[:-1], len(self.spec.concepts)), c_true.device)
        return draw[..., self._column_concept]

    def concept_units(self) -> list[tuple[int, ...]]:
        return list(self.spec.units)

    def concept_index(self, concept: Any, position: int = 0) -> int:
        """A column id by id, column name, or concept name (a categorical concept: its first column)."""
        if isinstance(concept, str) and concept in self.spec.concepts and concept not in self.concept_names:
            return self.spec.units[self.spec.concepts.index(concept)][0]
        return super().concept_index(concept, position)

    def concept_kinds(self) -> tuple[str, ...]:
        return tuple(self.spec.column_types)

    def _by_type(self, kind: str) -> list[int]:
        return [i for i, t in enumerate(self.spec.column_types) if t == kind]

    def concept_loss_terms(self, out: Any, c_true: torch.Tensor) -> torch.Tensor:
        """[..., k]: BCE on binary columns, squared error on continuous ones, and on each
        categorical group's columns its cross-entropy divided among them (they sum to it)."""
        logits = self.concept_scores(out)
        c_true = c_true.to(logits.dtype)
        terms = torch.zeros_like(logits)
        b, cont = self._by_type("binary"), self._by_type("continuous")
        if b:
            terms[..., b] = F.binary_cross_entropy_with_logits(logits[..., b], c_true[..., b], reduction="none")
        if cont:
            terms[..., cont] = (logits[..., cont] - c_true[..., cont]) ** 2
        for unit in (u for u, t in zip(self.spec.units, self.spec.types) if t == "categorical"):
            cols = list(unit)
            ce = -(c_true[..., cols] * torch.log_softmax(logits[..., cols].clamp(-30, 30), -1)).sum(-1)
            terms[..., cols] = (ce / len(cols))[..., None].expand(*ce.shape, len(cols))
        return terms

    def concept_loss(self, out: Any, c_true: torch.Tensor) -> torch.Tensor:
        """Σ over concepts of weight × mean loss, over the number of concepts."""
        terms = self.concept_loss_terms(out, c_true)
        per_column = terms.reshape(-1, terms.shape[-1]).mean(0)
        return (per_column * self.concept_weights.to(per_column.dtype)).sum() / len(self.spec.concepts)

    def loss(self, batch: tuple, mode: str = "joint") -> torch.Tensor:
        if mode == "concepts":
            x, c, _ = batch
            terms = self.concept_loss_terms(self(x), c)
            return terms.reshape(-1, terms.shape[-1]).mean(0).sum() / len(self.spec.concepts)
        return super().loss(batch, mode)

    def concept_probabilities(self, out: Any) -> torch.Tensor:
        """Binary: σ(logit); categorical: the group's softmax; continuous: 0.5 (no probability)."""
        c_logit = self.concept_scores(out)
        probs = torch.sigmoid(c_logit)
        cont = self._by_type("continuous")
        if cont:
            probs[..., cont] = 0.5
        for unit in (u for u, t in zip(self.spec.units, self.spec.types) if t == "categorical"):
            probs[..., list(unit)] = torch.softmax(c_logit[..., list(unit)].clamp(-30, 30), -1)
        return probs

    @torch.no_grad()
    def concept_report(self, data: Any) -> dict:
        """Per concept, by type: {'type', 'accuracy'} (binary: threshold 0.5; categorical: argmax
        over the group) or {'type', 'r2', 'mse'} (continuous). data: (x, c, y)."""
        x, c = tuple(getattr(data, "tensors", data))[:2]
        was = self.training
        self.eval()
        try:
            out = self(x)
        finally:
            self.train(was)
        probs, pred = self.concept_probabilities(out), self.concept_scores(out)
        report = {}
        for name, kind, unit in zip(self.spec.concepts, self.spec.types, self.spec.units):
            cols = list(unit)
            if kind == "binary":
                acc = ((probs[..., cols[0]] > 0.5) == (c[..., cols[0]] > 0.5)).double().mean().item()
                report[name] = {"type": kind, "accuracy": acc}
            elif kind == "categorical":
                acc = (probs[..., cols].argmax(-1) == c[..., cols].argmax(-1)).double().mean().item()
                report[name] = {"type": kind, "accuracy": acc}
            else:
                err = ((pred[..., cols[0]] - c[..., cols[0]]) ** 2).mean().item()
                var = c[..., cols[0]].double().var(unbiased=False).item()
                report[name] = {"type": kind, "mse": err, "r2": 1 - err / var if var > 0 else float("nan")}
        return report

    @torch.no_grad()
    def evaluate(self, data: tuple, intervene_all: bool = False) -> dict:
        """Task accuracy, the mean accuracy over discrete concepts, the mean R² over continuous
        ones and, with `intervene_all`, the accuracy with every concept set to its label."""
        from penrose_zoo.metrics import accuracy

        x, c, y = data
        report = self.concept_report(data)
        was = self.training
        self.eval()
        try:
            res = {"acc": accuracy(self(x).y, y)}
            discrete = [r["accuracy"] for r in report.values() if "accuracy" in r]
            r2 = [r["r2"] for r in report.values() if "r2" in r]
            if discrete:
                res["concept_acc"] = sum(discrete) / len(discrete)
            if r2:
                res["concept_r2"] = sum(r2) / len(r2)
            if intervene_all:
                res["acc_all_concepts_set"] = accuracy(self(x, c_true=c, do=self._all_do).y, y)
        finally:
            self.train(was)
        return res

    def explain(self, x: torch.Tensor, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> Explanation:
        e = super().explain(x, c_true, do)
        e.details.update({"concept_types": tuple(self.spec.column_types), "concept_groups": dict(self.spec.groups)})
        return e

