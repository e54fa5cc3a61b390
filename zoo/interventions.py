"""Interventions on any concept model of the zoo: which concepts to set (policies), to what
(strategies), and the task accuracy against the fraction of concepts set (intervention curves).

    curve = intervention_curve(model, (x, c, y), UncertaintyPolicy())   # fractions 0, 0.1, …, 1
    curve.accuracy, intervention_score(curve)                           # area under the curve
    penrose_zoo.plots.plot_intervention_curves([curve, other])

Every concept diagram takes `c_true[k]` and `do[k]`; a policy ranks the concepts of each example
(the first ranked is set first), and at fraction φ the first round(φ·k) of each example's
ranking are set (`do`), to the values a strategy gives (`c_true`). Policies:

  RandomPolicy(seed)    a random order per example (the baseline of every concept paper)
  UncertaintyPolicy()   the least certain predicted concept first, |p − 0.5| ascending (Shin et
                        al. 2023's "uncertainty of concept prediction")
  OrderPolicy(order)    a given order of ids or names (e.g. an expert's), the rest after in id order
  GradientPolicy()      the largest expected change of the predicted class's logit first, to
                        first order: |∂y_ŷ/∂b_i| · E|v_i − b_i| with v_i drawn from the predicted
                        concept (b: the bottleneck value, v: the value an intervention sets) —
                        the "expected change in target prediction" criterion of Shin et al.,
                        "A Closer Look at the Intervention Procedure of Concept Bottleneck
                        Models", ICML 2023, linearised so that one backward pass scores all k
                        concepts. For a probability bottleneck E|v − p| = 2p(1 − p).

Strategies (what an intervened concept is set to, in the diagram's bottleneck space):

  GroundTruth()         the true label, through `model.bottleneck_values` (a probability
                        bottleneck takes the label; the logit CBM its training percentiles)
  FixedValue(v)         a fixed value (one, or one per concept), whatever the label: a do()
  Quantile(q).fit(model, x_train)
                        the q-th (label 1) or (1 − q)-th (label 0) quantile of the concept's
                        predicted bottleneck values on the training inputs

Rankings are computed once, from the model's own prediction without interventions, unless
`sequential=True`: then, as in the sequential intervention of Shin et al. (2023) and the
learned-policy papers after it, the policy scores the concepts again after each one is set, on
the model's outputs with the interventions so far (a gradient policy sees the new prediction
and bottleneck; an uncertainty policy sees the descendants' new probabilities in a graph model),
and the next concept is the best-scored one not yet set (`sequential_intervention_masks`). A
fraction counts concepts: a categorical concept (several columns, `model.concept_units()`) is
set whole, when its best-ranked column's turn comes.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import torch

from penrose.errors import PenroseArgumentError, seed_value
from penrose_zoo.core import InterventionError
from penrose_zoo.validate import flag, number, whole

if TYPE_CHECKING:
    from penrose_zoo.concepts import ConceptModel

__all__ = [
    "InterventionTarget",
    "Policy",
    "RandomPolicy",
    "UncertaintyPolicy",
    "OrderPolicy",
    "GradientPolicy",
    "Strategy",
    "GroundTruth",
    "FixedValue",
    "Quantile",
    "InterventionCurve",
    "intervention_masks",
    "sequential_intervention_masks",
    "intervention_curve",
    "intervention_score",
    "DEFAULT_FRACTIONS",
    "POLICIES",
    "STRATEGIES",
]

DEFAULT_FRACTIONS = tuple(i / 10 for i in range(11))


class InterventionTarget(torch.nn.Module):
    """What the policies, strategies and curves use of a model, for models outside the zoo's
    concept diagrams (an adapter: `penrose_zoo.steerling.interventions.KnownConcepts` for
    Steerling's known concepts). A subclass sets `concept_names` and `sizes = {"k": …}` and
    implements `forward(x, c_true=None, do=None)` -> outputs with `y` (task logits), `c` (the
    bottleneck after interventions) and `c_logit` (concept logits before them); `do` [n, k]
    sets the concepts to `c_true` where True. The defaults: one column per concept, a
    probability bottleneck (labels are the values), no backbone."""

    task = "multiclass"
    concept_names: tuple[str, ...] = ()
    sizes: dict = {}

    def features(self, x: Any) -> Any:
        return x

    @contextmanager
    def given_features(self) -> Iterator["InterventionTarget"]:
        yield self

    def concept_units(self) -> list[tuple[int, ...]]:
        return [(i,) for i in range(self.sizes["k"])]

    def concept_index(self, concept: Any, position: int = 0) -> int:
        from penrose_zoo.concepts import resolve_concept

        return resolve_concept(self.concept_names, concept, position)

    def bottleneck(self, out: Any) -> torch.Tensor:
        return out.c

    def bottleneck_values(self, c: torch.Tensor) -> torch.Tensor:
        return c

    def concept_scores(self, out: Any) -> torch.Tensor:
        return out.c_logit

    def concept_probabilities(self, out: Any) -> torch.Tensor:
        return torch.sigmoid(self.concept_scores(out))

    @property
    def _all_do(self) -> torch.Tensor:
        return torch.ones(self.sizes["k"], dtype=torch.bool)


def _check_labels(model, c: torch.Tensor, y: torch.Tensor) -> None:
    """The curve's labels as training takes them (`penrose_zoo.validate`): concept labels by the
    concepts' types (a ground-truth intervention sets them), task labels by the task (accuracy
    compares with them)."""
    from penrose_zoo.validate import concept_labels, task_labels

    kinds = model.concept_kinds() if hasattr(model, "concept_kinds") else ("binary",) * c.shape[-1]
    concept_labels(c, "data[1] (c)", kinds, model.concept_units(), getattr(model, "concept_names", None))
    task_labels(y, "data[2] (y)", model.task, model.sizes.get("r"))


def _check_model(model):
    from penrose_zoo.concepts import ConceptModel

    if not isinstance(model, (ConceptModel, InterventionTarget)):
        raise TypeError(f"interventions need a concept model (a penrose_zoo ConceptModel or an InterventionTarget), "
                        f"got {type(model).__name__}")


# ---- policies ---------------------------------------------------------------------------------


class Policy:
    """Ranks each example's concepts: `ranking(model, x, c, out)` -> ids [n, k], first = set first.
    `x` is what the diagram reads (backbone features), `out` the model's outputs on it."""

    name = "policy"

    def ranking(self, model, x, c, out) -> torch.Tensor:
        return (-self.scores(model, x, c, out)).argsort(dim=-1, stable=True)

    def scores(self, model, x, c, out) -> torch.Tensor:
        """Higher = intervene earlier, [n, k]."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RandomPolicy(Policy):
    """A random order per example, from `seed` (the same seed, the same orders)."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed_value(seed)

    def scores(self, model, x, c, out):
        g = torch.Generator().manual_seed(self.seed)
        return torch.rand(c.shape, generator=g).to(c.device)

    def __repr__(self):
        return f"RandomPolicy(seed={self.seed})"


class UncertaintyPolicy(Policy):
    """The least certain predicted concept first: scores −|p − 0.5|."""

    name = "uncertainty"

    def scores(self, model, x, c, out):
        return -(model.concept_probabilities(out) - 0.5).abs()


class OrderPolicy(Policy):
    """A given order (ids or names); concepts it leaves out follow in id order."""

    name = "order"

    def __init__(self, order: Sequence):
        if isinstance(order, (str, bytes)) or not isinstance(order, (Sequence, torch.Tensor)):
            raise PenroseArgumentError(f"OrderPolicy's order must be a list of concept ids or names, got {order!r}")
        self.order = list(order)

    def ranking(self, model, x, c, out):
        ids = [model.concept_index(o, i) for i, o in enumerate(self.order)]
        if len(set(ids)) != len(ids):
            raise InterventionError(f"intervention order names a concept twice: ids {ids}")
        rest = [i for i in range(model.sizes["k"]) if i not in ids]
        return torch.tensor(ids + rest, device=c.device).expand(c.shape[0], -1)

    def __repr__(self):
        return f"OrderPolicy({self.order!r})"


class GradientPolicy(Policy):
    """Linearised expected change of the predicted class's logit (Shin et al. 2023's ECTP):
    |∂y_ŷ/∂b_i| · (p_i |v¹_i − b_i| + (1 − p_i) |v⁰_i − b_i|), v¹ / v⁰ the values that set
    concept i to 1 / 0 (`model.bottleneck_values`), b the predicted bottleneck, p the
    predicted probability."""

    name = "gradient"

    def scores(self, model, x, c, out):
        with torch.enable_grad():
            b = model.bottleneck(out).detach().requires_grad_(True)
            y = model(x, c_true=b, do=model._all_do.expand(b.shape)).y
            target = y.argmax(-1, keepdim=True) if y.shape[-1] > 1 else torch.zeros(y.shape[:-1] + (1,), dtype=torch.long, device=y.device)
            (grad,) = torch.autograd.grad(y.gather(-1, target).sum(), b)
        p = model.concept_probabilities(out).detach()
        v1 = model.bottleneck_values(torch.ones_like(p))
        v0 = model.bottleneck_values(torch.zeros_like(p))
        change = p * (v1 - b.detach()).abs() + (1 - p) * (v0 - b.detach()).abs()
        return grad.abs() * change


# ---- strategies -------------------------------------------------------------------------------


class Strategy:
    """`values(model, x, c)` -> the c_true an intervention sets, [n, k] (bottleneck space)."""

    name = "strategy"

    def values(self, model, x, c) -> torch.Tensor:
        raise NotImplementedError


class GroundTruth(Strategy):
    """The true labels, through `model.bottleneck_values`."""

    name = "ground truth"

    def values(self, model, x, c):
        return model.bottleneck_values(c)

    def __repr__(self):
        return "GroundTruth()"


class FixedValue(Strategy):
    """A fixed value (a number or one per concept), whatever the label."""

    name = "fixed value"

    def __init__(self, value):
        try:
            v = torch.as_tensor(value, dtype=torch.float64) if not isinstance(value, (str, bytes, bool)) else None
        except (TypeError, ValueError, RuntimeError):
            v = None
        if v is None or v.dim() > 1 or v.numel() == 0:
            raise InterventionError(f"FixedValue needs a number or a list of numbers (one per concept), got {value!r}")
        bad = ~torch.isfinite(v)
        if bool(bad.any()):  # as `intervene` refuses it: a do() to inf or NaN is no value
            where = "" if v.dim() == 0 else f" at index {int(bad.nonzero()[0, 0])}"
            raise InterventionError(f"FixedValue holds a value that is not finite{where}: {value!r}")
        self.value = value

    def values(self, model, x, c):
        v = torch.as_tensor(self.value, dtype=c.dtype, device=c.device)
        if v.dim() > 0 and v.shape != (c.shape[-1],):
            raise InterventionError(f"FixedValue needs one value or k = {c.shape[-1]} values, got shape {tuple(v.shape)}")
        return v.expand(c.shape).clone()

    def __repr__(self):
        return f"FixedValue({self.value!r})"


class Quantile(Strategy):
    """The q-th quantile (label 1) or (1 − q)-th (label 0) of each concept's predicted bottleneck
    values over training inputs; call `fit(model, x_train)` first."""

    name = "quantile"

    def __init__(self, q: float = 0.95):
        self.q = number(q, "Quantile q", low=0.5, high=1.0)
        self.low = self.high = None

    @torch.no_grad()
    def fit(self, model, x_train) -> "Quantile":
        _check_model(model)
        was = model.training
        model.eval()
        try:
            b = model.bottleneck(model(x_train)).double()
        finally:
            model.train(was)
        if b.numel() == 0 or not bool(torch.isfinite(b).all()):  # (NaN quantiles would set concepts to NaN)
            raise InterventionError("Quantile.fit: the model's bottleneck values on x_train are "
                                    + ("empty (no rows)" if b.numel() == 0 else "not all finite (NaN or inf inputs or weights?)"))
        qs = torch.tensor([1 - self.q, self.q], dtype=torch.float64, device=b.device)
        self.low, self.high = torch.quantile(b.reshape(-1, b.shape[-1]), qs, dim=0)
        return self

    def values(self, model, x, c):
        if self.low is None:
            raise InterventionError("Quantile strategy used before fit(model, x_train)")
        return torch.where(c > 0.5, self.high.to(c.dtype), self.low.to(c.dtype))

    def __repr__(self):
        return f"Quantile(q={self.q})"


#: policies and strategies by name (those that need no argument), for `intervention_curve`
POLICIES = {"random": RandomPolicy, "uncertainty": UncertaintyPolicy, "gradient": GradientPolicy}
STRATEGIES = {"ground truth": GroundTruth}


def _named(given: Any, what: str, table: dict, kind: type, default: Any) -> Any:
    """A policy or strategy: the default for None, an instance as it is, a name from `table`."""
    if given is None:
        return default
    if isinstance(given, kind):
        return given
    if isinstance(given, str) and given in table:
        return table[given]()
    hint = {"order": "OrderPolicy([...])", "fixed value": "FixedValue(v)",
            "quantile": "Quantile(q).fit(model, x_train)"}.get(given) if isinstance(given, str) else None
    raise PenroseArgumentError(f"{what} must be a {kind.__name__} or one of the names {', '.join(map(repr, table))}"
                               + (f"; {given!r} needs its argument: {hint}" if hint else f", got {given!r}"))


# ---- curves -----------------------------------------------------------------------------------


def _positions(ranking: torch.Tensor) -> torch.Tensor:
    """position[n, i]: where concept i stands in example n's ranking."""
    k = ranking.shape[-1]
    position = torch.empty_like(ranking)
    position.scatter_(-1, ranking, torch.arange(k, device=ranking.device).expand_as(ranking))
    return position


def intervention_masks(ranking: torch.Tensor, fraction: float, units: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
    """do [n, k]: each example's first round(fraction · number of concepts) ranked concepts. With
    `units` (the columns of each concept, `model.concept_units()`), a concept stands where its
    best-ranked column stands and all its columns are set together."""
    fraction = number(fraction, "intervention fraction", low=0.0, high=1.0, error=InterventionError)
    position = _positions(ranking)
    if units is None or all(len(u) == 1 for u in units) and len(units) == ranking.shape[-1]:
        return position < int(round(fraction * ranking.shape[-1]))
    unit_position = torch.stack([position[..., list(u)].min(-1).values for u in units], -1)
    unit_do = _positions(unit_position.argsort(dim=-1, stable=True)) < int(round(fraction * len(units)))
    do = torch.zeros_like(ranking, dtype=torch.bool)
    for j, u in enumerate(units):
        do[..., list(u)] = unit_do[..., j:j + 1]
    return do


def _unit_scores(policy: Policy, model, x, c, out, units: Sequence[Sequence[int]]) -> torch.Tensor:
    """[n, concepts]: higher = set earlier; a concept stands where its best-ranked column stands
    (from the policy's ranking, so every policy, scored or ordered, ranks the same way)."""
    position = _positions(policy.ranking(model, x, c, out))
    return -torch.stack([position[..., list(u)].min(-1).values for u in units], -1).to(torch.float64)


def sequential_intervention_masks(model: ConceptModel | InterventionTarget, x: torch.Tensor, c: torch.Tensor, policy: Policy,
                                  values: torch.Tensor, steps: int | None = None) -> list[torch.Tensor]:
    """do masks [n, k] after 0, 1, …, `steps` (default: every concept) sequential interventions:
    at each step the policy ranks the concepts on the model's outputs under the interventions so
    far (`values` where set), and each example sets its best-ranked concept not yet set (a
    categorical concept's columns together). `x` is what the diagram reads."""
    units = model.concept_units()
    steps = len(units) if steps is None else whole(steps, "sequential intervention steps", low=0, high=len(units),
                                                   error=InterventionError)
    column_unit = torch.zeros(c.shape[-1], dtype=torch.long, device=c.device)
    for j, u in enumerate(units):
        column_unit[list(u)] = j
    chosen = torch.zeros(c.shape[0], len(units), dtype=torch.bool, device=c.device)
    do = torch.zeros(c.shape, dtype=torch.bool, device=c.device)
    masks = [do]
    for _ in range(steps):
        out = model(x, c_true=values, do=do)
        scores = _unit_scores(policy, model, x, c, out, units).masked_fill(chosen, float("-inf"))
        best = scores.argmax(-1)
        chosen = chosen.clone()
        chosen[torch.arange(c.shape[0], device=c.device), best] = True
        do = chosen[:, column_unit]
        masks.append(do)
    return masks


@dataclass
class InterventionCurve:
    """Task accuracy (or −MSE for regression) at each fraction of concepts intervened on."""

    fractions: tuple[float, ...]
    accuracy: tuple[float, ...]
    policy: str = ""
    strategy: str = ""
    label: str = ""
    concept_accuracy: float = float("nan")
    extra: dict = field(default_factory=dict)

    @property
    def score(self) -> float:
        return intervention_score(self)


def intervention_score(curve: InterventionCurve | Sequence[float], fractions: Sequence[float] | None = None) -> float:
    """The area under the intervention curve over its fraction range, divided by that range
    (trapezoids): the mean accuracy over fractions, in [0, 1]."""
    if isinstance(curve, InterventionCurve):
        xs, acc = list(curve.fractions), list(curve.accuracy)
    else:
        xs, acc = list(fractions or ()), list(curve)
    f = torch.as_tensor(xs, dtype=torch.float64)
    a = torch.as_tensor(acc, dtype=torch.float64)
    if f.numel() != a.numel() or f.numel() < 2:
        raise ValueError(f"an intervention score needs ≥ 2 points with as many fractions ({f.numel()}) as values ({a.numel()})")
    if not bool((f[1:] > f[:-1]).all()):
        raise ValueError(f"fractions must increase, got {f.tolist()}")
    return float(torch.trapezoid(a, f) / (f[-1] - f[0]))


@torch.no_grad()
def intervention_curve(model: ConceptModel | InterventionTarget, data: Any, policy: Policy | None = None, fractions: Sequence[float] = DEFAULT_FRACTIONS,
                       strategy: Strategy | None = None, label: str = "", sequential: bool = False) -> InterventionCurve:
    """Task accuracy after setting, in each example, the first ⌊φ·k⌉ concepts of `policy`'s
    ranking to `strategy`'s values, for φ in `fractions`. data: (x, c, y); default policy
    RandomPolicy(0), default strategy GroundTruth(); a policy or strategy may be given by name
    ('random', 'uncertainty', 'gradient'; 'ground truth'). Regression tasks report −MSE.
    Fractions outside [0, 1] or not finite, and anything else that is not one of these, are a
    PenroseArgumentError naming the argument.
    sequential: re-rank after each concept is set (`sequential_intervention_masks`) instead of
    ranking once."""
    from penrose_zoo.metrics import accuracy

    _check_model(model)
    policy = _named(policy, "policy", POLICIES, Policy, RandomPolicy(0))
    strategy = _named(strategy, "strategy", STRATEGIES, Strategy, GroundTruth())
    tensors = tuple(getattr(data, "tensors", data)) if isinstance(data, (tuple, list)) or hasattr(data, "tensors") else ()
    if len(tensors) < 3 or not all(isinstance(t, torch.Tensor) for t in tensors[:3]):
        raise PenroseArgumentError(f"data must be (x, c, y) tensors, got {type(data).__name__}")
    x, c, y = tensors[:3]
    _check_labels(model, c, y)
    if isinstance(fractions, (str, bytes)) or not isinstance(fractions, (Sequence, torch.Tensor)) or not len(fractions):
        raise PenroseArgumentError(f"fractions must be a non-empty list of numbers from 0 to 1, got {fractions!r}")
    fractions = tuple(number(f, f"fractions[{i}]", low=0.0, high=1.0, error=InterventionError)
                      for i, f in enumerate(fractions))
    sequential = flag(sequential, "sequential")
    was = model.training
    model.eval()
    try:
        feats = model.features(x)
        with model.given_features():
            out = model(feats)
            values = strategy.values(model, feats, c)
            units = model.concept_units()
            if sequential:
                steps = [int(round(f * len(units))) for f in fractions]
                masks = sequential_intervention_masks(model, feats, c, policy, values, max(steps, default=0))
                chosen = [masks[n] for n in steps]
            else:
                ranking = policy.ranking(model, feats, c, out)
                chosen = [intervention_masks(ranking, f, units) for f in fractions]
            accs = []
            for do in chosen:
                y_hat = model(feats, c_true=values, do=do).y
                if model.task == "regression":
                    accs.append(-float(((y_hat.squeeze(-1) - y.to(y_hat.dtype)) ** 2).mean()))
                else:
                    accs.append(accuracy(y_hat, y))
            probs = model.concept_probabilities(out)
            concept_acc = ((probs > 0.5) == (c > 0.5)).double().mean().item()
    finally:
        model.train(was)
    name = getattr(policy, "name", repr(policy))
    return InterventionCurve(fractions, tuple(accs), f"{name}, sequential" if sequential else name,
                             getattr(strategy, "name", repr(strategy)), label or type(model).__name__,
                             concept_acc)
