"""What the concept models share: interventions, the concept loss, and the three training modes.

Every concept diagram takes the inputs `x[f]`, `c_true[k]` and `do[k] : bool`; where `do` is
True the diagram replaces the predicted concept by `c_true`. The wrapper fills them in:

    model(x)                                   no intervention
    model.intervene(x, [2, "law"], [1.0, 0.])  set concept 2 and concept "law" to given values
    model(x, c_true=c, do=mask)                the raw form (mask [k] or [..., k])

The concept loss weighs each concept: `concept_weight` is one number or one per concept (names
in `concept_names` order), and the loss is Σ_k w_k · mean BCE_k / k (a single w: w × the mean
concept BCE). Raising a concept's weight trades task accuracy for that concept's accuracy.

A backbone (any nn.Module) may sit in front of the diagram's input: `backbone=net` with
`backbone_mode='finetune'` (trained with the rest), 'frozen' (kept fixed, in eval mode) or
'cached' (fixed, and `fit` runs it once over the data and trains the diagram on the features).
The diagram's `f` is then the backbone's output width.

Training-time interventions (RandInt, Espinosa Zarlenga et al. 2022): with `p_int` > 0, joint
training sets each concept to its label with probability p_int, so the task predictor learns to
read true concepts as well as predicted ones and test-time interventions help rather than hurt
(default 0 for the bottlenecks, 0.25 for the concept embedding model). `randint='concept'` (the
default, the CEM paper's RandInt) draws once per concept and example; `randint='example'` draws
once per example and sets all its concepts together (what PyC's models do by default, where the
concepts share one plate variable).

Tasks: 'multiclass' (r logits, cross-entropy), 'binary' (r = 1 logit, BCE) or 'regression'.

Training modes (`model.fit(train, val, mode=...)`, through `penrose_zoo.train.fit`), as in Koh et al.:
    'joint'        task loss on predicted concepts + concept_weight × concept loss, one pass;
    'independent'  the task predictor reads the true concepts (do = all True) while the concept
                   predictor learns from the concept loss alone; at test time it reads predictions;
    'sequential'   first the concept predictor alone (concept loss), then, with it frozen, the
                   task predictor on its predicted concepts (task loss).
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Any, Callable, ClassVar, Iterator, Sequence

import torch
import torch.nn.functional as F

from penrose import PenroseShapeError
from penrose.errors import PenroseArgumentError
from penrose.gradients import GradientPlan, NoGeneratedBackward
from penrose_zoo.core import InterventionError, ZooModel, bce_grad_scaled, task_loss, task_loss_grad
from penrose_zoo.validate import number

__all__ = ["BACKBONE_MODES", "BACKWARDS", "LOSS_MODES", "ConceptModel", "GeneratedStep", "resolve_concept"]

#: how a backbone in front of a concept model trains
BACKBONE_MODES = ("finetune", "frozen", "cached")
#: how `fit` differentiates: the generated backward where it covers the model, else autograd
#: ('auto'); always the generated one (an error where it cannot); always autograd
BACKWARDS = ("auto", "generated", "autograd")
#: what `ConceptModel.loss(batch, mode)` computes (sequential training is 'concepts' then 'task')
LOSS_MODES = ("joint", "independent", "concepts", "task")


class ConceptModel(ZooModel):
    """Base of the concept models (bottleneck, embedding, prototype, mixture)."""

    concept_params: ClassVar[tuple[str, ...]] = ()  # the concept predictor's parameters
    modes: ClassVar[tuple[str, ...]] = ("joint", "independent", "sequential")
    tasks = ("multiclass", "binary", "regression")
    default_task = "multiclass"

    batch_form: ClassVar[tuple[str, ...] | None] = ("x", "c", "y")
    default_p_int: ClassVar[float] = 0.0
    #: RandInt's granularity: one draw per concept and example, or one per example
    RANDINT = ("concept", "example")

    def __init__(self, *, concept_names: Sequence[str] | None = None, concept_weight: Any = 1.0,
                 backbone: torch.nn.Module | None = None, backbone_mode: str = "finetune",
                 p_int: float | None = None, randint: str = "concept", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        p_int = self.default_p_int if p_int is None else number(p_int, "p_int", low=0.0, high=1.0)
        if randint not in self.RANDINT:
            raise ValueError(f"randint must be one of {self.RANDINT}, got {randint!r}")
        self.p_int = float(p_int)
        self.randint = randint
        self._threshold: tuple[tuple, torch.Tensor] | None = None  # (p_int, dtype, device) -> p_int as a tensor
        k = self.sizes["k"]
        if k < 1:  # (no bottleneck: every concept loss, intervention and explanation would be empty)
            raise PenroseArgumentError(f"{type(self).__name__}: a concept model needs at least one concept, got k = {k}")
        if concept_names is None:
            concept_names = tuple(f"c{i}" for i in range(k))
        if isinstance(concept_names, str) or not all(isinstance(n, str) and n for n in concept_names):
            raise PenroseArgumentError(f"concept_names must be a list of non-empty strings, got {concept_names!r}")
        if len(concept_names) != k:
            raise ValueError(f"{len(concept_names)} concept names for k = {k} concepts")
        if len(set(concept_names)) != k:  # (a name would set the first of them only)
            raise PenroseArgumentError(f"concept_names must be distinct, got {list(concept_names)}")
        self.concept_names = tuple(concept_names)
        self.register_buffer("concept_weights", self._concept_weights(concept_weight, k), persistent=False)
        self.register_buffer("_no_do", torch.zeros(k, dtype=torch.bool), persistent=False)
        self.register_buffer("_all_do", torch.ones(k, dtype=torch.bool), persistent=False)
        self.register_buffer("_no_c", torch.zeros(k), persistent=False)
        if backbone_mode not in BACKBONE_MODES:
            raise ValueError(f"backbone_mode must be one of {BACKBONE_MODES}, got {backbone_mode!r}")
        if backbone is not None and not isinstance(backbone, torch.nn.Module):
            raise TypeError(f"backbone must be a torch.nn.Module, got {type(backbone).__name__}")
        self.backbone = backbone
        self.backbone_mode = backbone_mode
        self._features_given = False  # True while fit trains on cached backbone features
        if backbone is not None and backbone_mode != "finetune":
            backbone.requires_grad_(False)
            backbone.eval()

    def _concept_weights(self, weight: Any, k: int) -> torch.Tensor:
        if isinstance(weight, dict):
            unknown = sorted(set(weight) - set(self.concept_names))
            if unknown:
                raise ValueError(f"concept_weight names {unknown[0]!r}, not a concept; the names are "
                                 f"{', '.join(self.concept_names)}")
            weight = [weight.get(n, 1.0) for n in self.concept_names]
        try:
            w = torch.as_tensor(weight, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError):
            raise PenroseArgumentError(f"concept_weight must be a number, one per concept or a dict of them by name, "
                                       f"got {weight!r}") from None
        if w.dim() == 0:
            w = w.expand(k).clone()
        if w.shape != (k,):
            raise ValueError(f"concept_weight must be one number or k = {k} numbers, got shape {tuple(w.shape)}")
        if not torch.isfinite(w).all() or (w < 0).any():
            raise ValueError(f"concept_weight must be finite and ≥ 0, got {w.tolist()}")
        return w

    @property
    def concept_weight(self) -> float:
        """The mean concept-loss weight (the single weight when all concepts share one)."""
        return float(self.concept_weights.mean())

    def train(self, mode: bool = True) -> ConceptModel:
        super().train(mode)
        if self.backbone is not None and self.backbone_mode != "finetune":
            self.backbone.eval()  # a fixed backbone keeps its eval behaviour (dropout, batch norm)
        return self

    def features(self, x: Any) -> torch.Tensor:
        """The diagram's input for raw input x: backbone(x), or x without a backbone."""
        if self.backbone is None or self._features_given:
            return x
        if self.backbone_mode == "finetune":
            return self.backbone(x)
        with torch.no_grad():
            return self.backbone(x)

    @torch.no_grad()
    def cache_features(self, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
        """backbone(x) computed once, in batches, in eval mode (the 'cached' backbone mode)."""
        if self.backbone is None:
            return x
        was = self.backbone.training
        self.backbone.eval()
        try:
            return torch.cat([self.backbone(x[i:i + batch_size]) for i in range(0, x.shape[0], batch_size)])
        finally:
            self.backbone.train(was)

    @contextmanager
    def given_features(self) -> Iterator[ConceptModel]:
        """Inside, forward reads diagram inputs (backbone features), not raw inputs."""
        before = self._features_given
        self._features_given = True
        try:
            yield self
        finally:
            self._features_given = before

    # -- forward and interventions
    def forward(self, x: Any, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> Any:
        """The diagram's outputs (each model names them: its `forward`'s NamedTuple)."""
        return self._run(x, c_true, do)

    def _run(self, x: Any, c_true: torch.Tensor | None = None, do: torch.Tensor | None = None) -> Any:
        """The diagram's outputs; `do` (bool [k] or [..., k]) sets concepts to `c_true`.
        RandInt: in training mode, when `c_true` is given and `do` is not, each concept is set to
        its `c_true` with probability `p_int` (training-time interventions)."""
        return self.diagram(**self._diagram_inputs(x, c_true, do))

    def _diagram_inputs(self, x: Any, c_true: torch.Tensor | None, do: torch.Tensor | None) -> dict[str, Any]:
        """The diagram's inputs x, c_true and do for `_run`'s arguments (backbone, RandInt and
        the defaults applied, batch shapes checked)."""
        x = self.features(x)
        if do is None and c_true is not None and self.training and self.p_int > 0:
            do = self.random_do(c_true)
        if do is None:
            do = self._no_do
        if c_true is None:
            if do is not self._no_do:
                raise InterventionError("an intervention mask 'do' needs the values 'c_true' to set")
            c_true = self._no_c
        for name, t in (("c_true", c_true), ("do", do)):
            if isinstance(t, torch.Tensor) and isinstance(x, torch.Tensor) and t.dim() > 1 and x.dim() > 1:
                tb, xb = tuple(t.shape[:-1]), tuple(x.shape[:-1])
                if tb == xb:
                    continue
                try:
                    ok = torch.broadcast_shapes(tb, xb) == torch.Size(xb)
                except RuntimeError:
                    ok = False
                if not ok:
                    raise PenroseShapeError(f"input {name!r} has batch shape {tb} but input 'x' has {xb}")
        return {"x": x, "c_true": c_true, "do": do}

    def random_do(self, c_true: torch.Tensor) -> torch.Tensor:
        """RandInt's mask: each concept set with probability `p_int` (one draw per column here;
        with `randint='example'` one draw per example, for all its columns)."""
        if self.randint == "example":
            return self._example_do(c_true)
        return self._drawn(c_true.shape, c_true.device)

    def _example_do(self, c_true: torch.Tensor) -> torch.Tensor:
        """One RandInt draw per example, spread over all k columns."""
        return self._drawn((*c_true.shape[:-1], 1), c_true.device).expand_as(c_true)

    def _drawn(self, shape: Sequence[int], device: torch.device) -> torch.Tensor:
        """torch.rand(shape) < p_int: each entry True with probability p_int. (p_int is compared
        as a tensor of rand's dtype, made once: a Python number is converted at every call.)"""
        draw = torch.rand(shape, device=device)
        key = (self.p_int, draw.dtype, draw.device)
        if self._threshold is None or self._threshold[0] != key:
            self._threshold = (key, torch.tensor(self.p_int, dtype=draw.dtype, device=draw.device))
        return draw < self._threshold[1]

    def concept_index(self, concept: Any, position: int = 0) -> int:
        """The id of a concept given by id or by name; out-of-range ids raise InterventionError."""
        return resolve_concept(self.concept_names, concept, position)

    def intervention(self, concepts: Sequence | int | str, values: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(c_true, do) that set `concepts` (ids or names) to `values` (a number, one per concept,
        or a tensor [..., len(concepts)] for per-example values)."""
        if isinstance(concepts, (int, str)) or (isinstance(concepts, torch.Tensor) and concepts.dim() == 0):
            concepts = [concepts]
        ids = [self.concept_index(c, i) for i, c in enumerate(concepts)]
        if len(set(ids)) != len(ids):
            raise InterventionError(f"intervention names a concept twice: ids {ids}")
        ref = self._no_c
        try:
            v = torch.as_tensor(values, dtype=ref.dtype, device=ref.device)
        except (TypeError, ValueError, RuntimeError):
            raise InterventionError(f"intervention values must be numbers (one, one per concept, or a tensor), "
                                    f"got {values!r}") from None
        if v.dim() == 0:
            v = v.expand(len(ids))
        if v.shape[-1] != len(ids):
            raise InterventionError(
                f"intervention values have {v.shape[-1]} entries in their last dimension but "
                f"{len(ids)} concepts are set"
            )
        bad = ~torch.isfinite(v)
        if bad.any():
            index = tuple(int(i) for i in bad.nonzero()[0])
            raise InterventionError(f"intervention values hold a non-finite value at index {index}")
        c_true = ref.expand(*v.shape[:-1], -1).clone()
        c_true[..., ids] = v
        do = self._no_do.clone()
        do[ids] = True
        return c_true, do

    def intervene(self, x: Any, concepts: Sequence | int | str, values: Any) -> Any:
        """The outputs with `concepts` set to `values` (see `intervention`)."""
        c_true, do = self.intervention(concepts, values)
        return self(x, c_true=c_true, do=do)

    # -- losses and training
    def concept_loss_terms(self, out: Any, c_true: torch.Tensor) -> torch.Tensor:
        """Per-example, per-concept losses [..., k]: binary cross-entropy of the predicted concepts
        (before interventions) against their labels."""
        scores = self.concept_scores(out)
        return F.binary_cross_entropy_with_logits(scores, c_true.to(scores.dtype), reduction="none")

    def concept_loss(self, out: Any, c_true: torch.Tensor) -> torch.Tensor:
        """Σ_k w_k · mean BCE_k / k, w = `concept_weights` (the mean BCE when every w_k is 1)."""
        scores = self.concept_scores(out)
        if type(self).concept_loss_terms is ConceptModel.concept_loss_terms:
            # the mean over examples and concepts of w_k · BCE: one operation, one autograd node
            return F.binary_cross_entropy_with_logits(scores, c_true.to(scores.dtype),
                                                      weight=self.concept_weights.to(scores.dtype))
        terms = self.concept_loss_terms(out, c_true)
        per_concept = terms.reshape(-1, terms.shape[-1]).mean(0)
        return (per_concept * self.concept_weights.to(per_concept.dtype)).mean()

    def bottleneck_values(self, c: torch.Tensor) -> torch.Tensor:
        """The values `c_true` must hold to set concepts to the labels c (probabilities in [0, 1]).
        The identity for a probability bottleneck; the logit model maps labels to logits."""
        return c

    def loss(self, batch: tuple, mode: str = "joint") -> torch.Tensor:
        """The loss of one (x, c, y) batch; mode 'joint' | 'independent' | 'concepts' | 'task'
        ('concepts' and 'task' are the two stages of sequential training). The concept loss is
        unweighted in 'concepts' (it is the only term) and weighted by `concept_weights` otherwise."""
        x, c, y = batch
        if mode == "joint":
            out = self(x, c_true=self.bottleneck_values(c))
            return task_loss(out.y, y, self.task) + self.concept_loss(out, c)
        if mode == "independent":
            out = self(x, c_true=self.bottleneck_values(c), do=self._all_do)
            return task_loss(out.y, y, self.task) + self.concept_loss(out, c)
        if mode == "concepts":
            terms = self.concept_loss_terms(self(x), c)
            return terms.mean()
        if mode == "task":
            return task_loss(self(x).y, y, self.task)
        raise ValueError(f"mode must be 'joint', 'independent', 'concepts' or 'task', got {mode!r}")

    def generated_step(self, mode: str = "joint") -> GeneratedStep:
        """One training step of `loss(batch, mode)` without autograd (`GeneratedStep`): the
        diagram runs through its generated backward (`penrose.gradients.GradientPlan`, planned
        now for the parameters that train now), seeded with the losses' closed-form gradients
        (`task_loss_grad`, `bce_grad`). Raises NoGeneratedBackward where that is not
        this model's step: a loss or concept loss of its own, a backbone that fine-tunes, or an
        operation of the diagram without a rule (`fit` then trains with autograd)."""
        for name in self.own_step_parts():
            raise NoGeneratedBackward(f"{type(self).__name__} has its own {name.strip('_').replace('_', ' ')}")
        if mode not in LOSS_MODES:
            raise ValueError(f"mode must be 'joint', 'independent', 'concepts' or 'task', got {mode!r}")
        if self.backbone is not None and self.backbone_mode == "finetune" and not self._features_given:
            raise NoGeneratedBackward("a fine-tuned backbone trains through autograd")
        return GeneratedStep(self, mode)

    def own_step_parts(self) -> list[str]:
        """The parts of the training step the generated step stands in for (the loss, the concept
        loss and its terms, the forward run, the diagram's inputs) that this model computes its
        own way: where there is one, `fit` trains with autograd."""
        me = type(self)
        return [name for name in ("loss", "concept_loss", "concept_loss_terms", "_run", "_diagram_inputs")
                if getattr(me, name) is not getattr(ConceptModel, name) or name in self.__dict__]

    def fit(self, train: Any, val: Any = None, *, mode: str = "joint", concept_epochs: int | None = None,
            **fit_kwargs: Any) -> dict:
        """Train in one of `self.modes` with `penrose_zoo.train.fit`; sequential runs two fits (the first for
        `concept_epochs`, default `epochs`) and returns {'concepts': history, 'task': history}.
        With a 'cached' backbone the backbone runs once over train and val, and the diagram trains
        on those features. `backward='auto'` (default) trains through the diagram's generated
        backward where it covers the model (`generated_step`; no autograd graph per step, the
        same gradients), else with autograd; 'generated' insists, 'autograd' never uses it; each
        history's 'backward' says which ran. Other keywords go to `penrose_zoo.train.fit`."""
        if mode not in self.modes:
            raise ValueError(f"{type(self).__name__} trains in modes {self.modes}, got {mode!r}")
        self.check_labels(train, "train")  # (before a cached backbone runs over the data)
        self.check_labels(val, "val")
        if self.backbone is not None and self.backbone_mode == "cached":
            train = self._with_features(train)
            val = None if val is None else self._with_features(val)
            with self.given_features():
                history = self._fit(train, val, mode, concept_epochs, fit_kwargs)
                self.after_fit(train)
        else:
            history = self._fit(train, val, mode, concept_epochs, fit_kwargs)
            self.after_fit(train)
        return history

    def _with_features(self, data: Any) -> tuple:
        tensors = tuple(getattr(data, "tensors", data))
        return (self.cache_features(tensors[0]),) + tensors[1:]

    def after_fit(self, train: Any) -> None:
        """Called at the end of `fit` with the training data (what forward reads)."""

    def fit_stage(self, stage: str, train: Any, val: Any = None, *, backward: str = "auto", **fit_kwargs: Any) -> dict:
        """One `penrose_zoo.train.fit` of `loss(batch, stage)` ('joint', 'independent', 'concepts'
        or 'task'): through the generated backward (`generated_step`) with backward='auto'
        where it covers this model, else autograd; 'generated' raises NoGeneratedBackward where
        it does not, 'autograd' always differentiates with autograd. The history's 'backward'
        says which ran (and why not the generated one)."""
        from penrose_zoo.train import fit

        if backward not in BACKWARDS:
            raise ValueError(f"backward must be one of {BACKWARDS}, got {backward!r}")
        self.check_labels(train, "train")
        self.check_labels(val, "val")
        step, why = None, "backward='autograd'"
        if backward != "autograd":
            try:
                step = self.generated_step(stage)
            except NoGeneratedBackward as e:
                if backward == "generated":
                    raise
                why = e.message
        history = fit(self, self.loss_fn(mode=stage), train, val, step_fn=step, **fit_kwargs)
        history["backward"] = "generated" if step is not None else f"autograd ({why})"
        return history

    def _fit(self, train: Any, val: Any, mode: str, concept_epochs: int | None, fit_kwargs: dict) -> dict:
        backward = fit_kwargs.pop("backward", "auto")

        def run(stage: str, kwargs: dict) -> dict:
            return self.fit_stage(stage, train, val, backward=backward, **kwargs)

        if mode != "sequential":
            return run(mode, fit_kwargs)
        first = dict(fit_kwargs)
        if concept_epochs is not None:
            first["epochs"] = concept_epochs
        first.pop("metric_fn", None)
        h1 = run("concepts", first)
        frozen = [p for n, p in self.diagram.named_parameters() if n in self.concept_params and p.requires_grad]
        if self.backbone is not None:
            frozen += [p for p in self.backbone.parameters() if p.requires_grad]
        for p in frozen:
            p.requires_grad_(False)
        try:
            h2 = run("task", fit_kwargs)
        finally:
            for p in frozen:
                p.requires_grad_(True)
        return {"concepts": h1, "task": h2}

    @torch.no_grad()
    def evaluate(self, data: tuple, intervene_all: bool = False) -> dict:
        """Task accuracy, concept accuracy (thresholded at 0.5), mean concept AUC and, with
        `intervene_all`, the accuracy when every concept is set to its true value. data: (x, c, y)."""
        from penrose_zoo.metrics import accuracy, mean_concept_auc

        tensors = tuple(getattr(data, "tensors", data)) if isinstance(data, (tuple, list)) or hasattr(data, "tensors") else ()
        if len(tensors) != 3:
            raise PenroseArgumentError(f"evaluate's data must be (x, c, y), got {type(data).__name__} of {len(tensors)}")
        was = self.training
        self.eval()
        try:
            x, c, y = tensors
            out = self(x)
            probs = self.concept_probabilities(out)
            res = {"acc": accuracy(out.y, y), "concept_acc": ((probs > 0.5) == (c > 0.5)).double().mean().item(),
                   "concept_auc": mean_concept_auc(self.concept_scores(out), c)}
            if intervene_all:
                res["acc_all_concepts_set"] = accuracy(self(x, c_true=self.bottleneck_values(c), do=self._all_do).y, y)
            return res
        finally:
            self.train(was)

    def concept_scores(self, out: Any) -> torch.Tensor:
        """Predicted concept scores before interventions (for AUC)."""
        return out.c_logit

    def concept_units(self) -> list[tuple[int, ...]]:
        """The columns each concept occupies; interventions set a concept's columns together
        (one column per concept here; a categorical concept has one per value)."""
        return [(i,) for i in range(self.sizes["k"])]

    def bottleneck(self, out: Any) -> torch.Tensor:
        """The concept values the task predictor read (what `c_true` replaces where `do` is set)."""
        return out.c

    def concept_probabilities(self, out: Any) -> torch.Tensor:
        """Predicted concept probabilities before interventions."""
        return torch.sigmoid(self.concept_scores(out))

    # -- inputs
    @classmethod
    def make_inputs(cls, sizes: dict, batch: int, generator: torch.Generator | None = None) -> dict:
        k = sizes["k"]
        return {
            "x": torch.randn(batch, sizes["f"], generator=generator),
            "c_true": (torch.rand(batch, k, generator=generator) < 0.5).float(),
            "do": torch.rand(batch, k, generator=generator) < 0.3,
        }


def resolve_concept(names: Sequence[str], concept: Any, position: int = 0) -> int:
    """The id of `concept` (an id, or one of `names`) among len(names) concepts; a name that is
    not one, an id out of range or anything else raises InterventionError naming `position` (the
    concept's place in the caller's list)."""
    k = len(names)
    if isinstance(concept, str):
        if concept not in names:
            raise InterventionError(
                f"intervention concepts[{position}] = {concept!r} is not a concept name; "
                f"the names are {', '.join(names)}"
            )
        return list(names).index(concept)
    if isinstance(concept, torch.Tensor) and concept.numel() == 1 and not concept.is_floating_point():
        concept = int(concept)
    if not isinstance(concept, int) or isinstance(concept, bool):
        raise InterventionError(f"intervention concepts[{position}] must be an int id or a name, got {concept!r}")
    if not 0 <= concept < k:
        raise InterventionError(
            f"intervention concepts[{position}] = {concept} is out of range: the model has k = {k} "
            f"concepts (ids 0..{k - 1})"
        )
    return concept


class GeneratedStep:
    """A concept model's training step through the diagram's generated backward.

    `step(batch)` runs one generated function (`GradientPlan.training_step`): the diagram's
    forward, the closed-form gradients of the task and concept losses as the backward's seeds,
    the backward, each trainable parameter's gradient added to its `.grad`. Without RandInt the
    plan fixes the intervention mask (and the labels, where only the mask's where reads them),
    so the bottleneck's where costs nothing. It returns None: the loss values, which cost about as much as the gradients on
    a small model, are computed together from the kept logits when `epoch_losses()` asks for
    them (one value per step since the last call; `penrose_zoo.train.fit` asks at the end of each
    epoch). `step.loss(batch)` is the same step returning its loss at once. The gradients and
    losses are `model.loss(batch, mode).backward()`'s (the tests compare them)."""

    FLUSH = 64  # steps kept before their losses are computed (bounds what is held)
    uses_autograd = False  # `fit` runs it under torch.no_grad() (it records no graph)

    def __init__(self, model: ConceptModel, mode: str) -> None:
        self.model, self.mode = model, mode
        self.plan = plan = GradientPlan(model.diagram)  # every input given (the RandInt step's plan)
        if "y" not in plan.output_names:
            raise NoGeneratedBackward(f"the diagram has no output 'y' (its outputs: {', '.join(plan.output_names)})")
        out = _example_outputs(model)
        if not isinstance(out, tuple) or len(out) != len(plan.outputs):
            raise NoGeneratedBackward(f"{type(model).__name__}'s outputs are not the diagram's {len(plan.outputs)}")
        self._score_name = ""  # the output the concept scores are (none in 'task' mode)
        if mode != "task":
            scores = model.concept_scores(out)
            found = [n for n, t in zip(plan.output_names, out) if t is scores]
            if not found:
                raise NoGeneratedBackward("the concept scores are not one of the diagram's outputs")
            self._score_name = found[0]
        self._checked = False
        self._task = model.task
        self._scales: dict[int, torch.Tensor] = {}  # per numel n: weight / n, and at -n the task's 1 / n (made once)
        self._row_weights: dict[torch.dtype, torch.Tensor] = {}  # per dtype: weight / k (made once)
        self._kept: list[tuple[Any, ...]] = []  # per step: (y, y target, scores, concept target, weight)
        self._done: list[torch.Tensor] = []
        self._weight = None if mode in ("concepts", "task") else model.concept_weights
        seeds: dict[str, Any] = {}
        if mode != "concepts":
            seeds["y"] = self._task_grad if self._task == "binary" else functools.partial(task_loss_grad, task=self._task)
        if mode != "task":
            if self._score_name in seeds:
                raise NoGeneratedBackward("the concept scores are the task output 'y'")
            seeds[self._score_name] = self._concept_grad
        self._seeds = seeds
        self._steps: dict[bool, _Compiled] = {}  # RandInt drawn or not -> the step written for it
        self._joint = mode == "joint"  # (RandInt draws only then)

    def prepare(self, tensors: tuple) -> tuple:
        """The training tensors (x, c, y) as the step reads them best, once per `fit`: a binary or
        regression target in the model's float dtype, a single one per example as a column [n, 1]
        (what the loss gradient would convert and reshape it to at every step). The same values:
        the losses and gradients are unchanged."""
        if len(tensors) != 3:
            return tensors
        x, c, y = tensors
        dtype = next((p.dtype for p in self.model.diagram.parameters() if p.is_floating_point()), None)
        if dtype is None:
            return tensors
        if self.mode != "concepts" and self._task in ("binary", "regression"):
            y = y.to(dtype)
            if y.dim() == 1 and self.model.sizes.get("r", 1) == 1:
                y = y.unsqueeze(-1)
        return x, c, y

    def __call__(self, batch: tuple) -> None:
        if torch.is_grad_enabled():
            with torch.no_grad():
                self._kept.append(self._step(batch))
        else:
            self._kept.append(self._step(batch))
        if len(self._kept) >= self.FLUSH:
            self._flush()

    def loss(self, batch: tuple) -> torch.Tensor:
        """The step, returning its loss (which `epoch_losses` gives too, as every step's)."""
        self(batch)
        self._flush()
        return self._done[-1][-1]

    def epoch_losses(self) -> torch.Tensor:
        """The losses of the steps since the last call, one per step, in order."""
        self._flush()
        done, self._done = self._done, []
        if not done:
            return torch.zeros(0)
        return torch.cat(done)

    def _compiled(self, randint: bool) -> _Compiled:
        """The step for this mode, written once (`GradientPlan.training_step`): the inputs that do
        not change from batch to batch fixed when planning (the intervention mask where no RandInt
        draws one, and `c_true` where nothing reads it then), so a mask all False or all True
        costs nothing."""
        made = self._steps.get(randint)
        if made is not None:
            return made
        model, plan = self.model, self.plan
        if not randint:
            fixed = {"do": model._all_do if self.mode == "independent" else model._no_do}
            if self.mode != "independent":
                fixed["c_true"] = model._no_c
            plan = GradientPlan(model.diagram, constants=fixed)
            if self.mode == "joint" and plan.reads_constant("c_true"):  # the labels read beyond the mask's where
                plan = GradientPlan(model.diagram, constants={"do": fixed["do"]})
        step = plan.training_step(self._seeds)
        made = self._steps[randint] = _Compiled(step, [n for n, _ in plan._inputs],
                                                [model.diagram.get_parameter(n) for n in step.params])
        return made

    def _step(self, batch: tuple) -> tuple[Any, ...]:
        x, c, y = batch
        if not self._checked:
            self._first(x, c)
        model = self.model
        randint = self._joint and model.training and model.p_int > 0
        compiled = self._steps.get(randint) or self._compiled(randint)
        x = model.features(x)
        if compiled.order is None:  # x alone
            inputs: tuple = (x,)
        else:  # c_true (and do) given at each step
            c_true = model.bottleneck_values(c)
            if isinstance(x, torch.Tensor) and c_true.shape[:-1] != x.shape[:-1]:
                model._diagram_inputs(x, c_true, None)  # its error for a batch of another shape
            inputs = (x, c_true, model.random_do(c_true) if randint else None)
            if compiled.order is not _XCD:
                inputs = tuple(inputs[i] for i in compiled.order)
        mode = self.mode
        if mode == "joint" or mode == "independent":  # the seeds' order
            values = compiled.run(*inputs, y, c, compiled.grads())
            return values[0], y, values[-1], c, self._weight
        if mode == "task":
            return compiled.run(*inputs, y, compiled.grads())[0], y, None, None, None
        return None, None, compiled.run(*inputs, c, compiled.grads())[-1], c, self._weight

    def _task_grad(self, y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """d BCE / d y for a binary task, `task_loss_grad`'s (σ(y) − t) / N with 1 / N a tensor
        made once per batch size (a Python number is converted at every call)."""
        if t.shape != y.shape:
            t = t.reshape(y.shape)
        n = y.numel()
        scale = self._scales.get(-n)
        if scale is None or scale.dtype != y.dtype or scale.device != y.device:
            scale = self._scales[-n] = torch.tensor(1.0 / n, dtype=y.dtype, device=y.device)
        return torch.sigmoid(y).sub_(t).mul_(scale)

    def _concept_grad(self, scores: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """d concept loss / d scores: Σ_k w_k · mean BCE_k / k's gradient (the plain mean in
        'concepts' mode)."""
        n = scores.numel()
        scale = self._scales.get(n)
        if scale is None or scale.dtype != scores.dtype:
            w = self._weight.to(scores.dtype) if self._weight is not None else torch.ones((), dtype=scores.dtype)
            scale = self._scales[n] = w / n
        return bce_grad_scaled(scores, c, scale)

    def _first(self, x: Any, c: torch.Tensor) -> None:
        """At the first batch, the compiled module's input checks: clear errors for a wrong batch."""
        model = self.model
        c_true = None if self.mode in ("concepts", "task") else model.bottleneck_values(c)
        do = model._all_do if self.mode == "independent" else model._no_do  # (no RandInt draw)
        with torch.no_grad():
            model.diagram(**model._diagram_inputs(x, c_true, do))
        self._checked = True

    def _flush(self) -> None:
        """The kept steps' losses, computed together: per-example losses of the concatenated
        logits (the task's and the weighted concepts', added where both have one row per
        example), then each step's mean (as `loss` takes it)."""
        kept, self._kept = self._kept, []
        if not kept:
            return
        parts = []
        if kept[0][0] is not None:
            parts.append(_row_losses([k[0] for k in kept], [k[1] for k in kept], self.model.task))
        if kept[0][2] is not None:
            parts.append(_row_losses([k[2] for k in kept], [k[3] for k in kept], "concepts", self._concept_row_weight))
        if len(parts) == 2 and parts[0][1] == parts[1][1]:  # the same rows: one mean of their sum
            parts = [(parts[0][0].add_(parts[1][0]), parts[0][1])]
        total = _step_means(*parts[0])
        for rows, counts in parts[1:]:
            total = total + _step_means(rows, counts)
        self._done.append(total)

    def _concept_row_weight(self, dtype: torch.dtype) -> torch.Tensor | None:
        """w / k, what a row's concept losses are weighed by to give its share of the mean."""
        w = self._weight
        if w is None:
            return None
        row = self._row_weights.get(dtype)
        if row is None:
            row = self._row_weights[dtype] = w.to(dtype) / w.numel()
        return row


class _Compiled:
    """A `TrainingStep` (`run` its emitted function), the names of its inputs, the params its
    gradients go to, and where its inputs come from: `order` indexes (x, c_true, do) in the
    step's input order (None: x alone; `_XCD`: that order)."""

    __slots__ = ("step", "run", "inputs", "order", "params")

    def __init__(self, step: Any, inputs: list[str], params: list[torch.nn.Parameter]) -> None:
        self.step, self.run, self.inputs, self.params = step, step.run, inputs, params
        if inputs == ["x"]:
            self.order: tuple[int, ...] | None = None
        else:
            order = tuple(("x", "c_true", "do").index(n) for n in inputs)
            self.order = _XCD if order == _XCD else order

    def grads(self) -> list[torch.Tensor]:
        """Each param's `.grad` (zeros made where it has none), for the step to add to."""
        grads = [p.grad for p in self.params]
        if any(g is None for g in grads):
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            grads = [p.grad for p in self.params]
        return grads  # type: ignore[return-value]


_XCD = (0, 1, 2)


def _example_outputs(model: ConceptModel) -> Any:
    """What the model's forward returns (its NamedTuple of the diagram's outputs) for one example,
    in eval mode: no RandInt draw, the training RNG is not touched."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad(), model.given_features():
            return model(**model.example_inputs(batch=1))
    finally:
        model.train(was)


def _row_losses(logits: list[torch.Tensor], targets: list[torch.Tensor], kind: str,
                row_weight: Callable[[torch.dtype], torch.Tensor | None] | None = None) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The steps' losses per example row (every leg but the last), concatenated, and each step's
    count of rows: `task_loss` (kind a task; a row's mean over its outputs) or the concept BCE
    (kind 'concepts'; a row's Σ_k w_k BCE_k / k, `row_weight(dtype)` giving w / k, or its mean
    without weights). Each step's mean of its rows is its loss."""
    z = torch.cat(logits)
    counts = tuple(lg.numel() // lg.shape[-1] for lg in logits)
    if kind == "multiclass":
        t = torch.cat([t.reshape(-1) for t in targets])
        rows = F.cross_entropy(z.reshape(-1, z.shape[-1]), t if t.dtype == torch.long else t.long(), reduction="none")
        return rows, counts
    same = all(t.shape[1:] == targets[0].shape[1:] for t in targets)  # (one cat, then one reshape)
    t = (torch.cat(targets) if same else torch.cat([t.reshape(-1) for t in targets])).reshape(z.shape).to(z.dtype)
    if kind in ("binary", "concepts"):
        per = F.binary_cross_entropy_with_logits(z, t, reduction="none")
    elif kind == "regression":
        per = (z - t) ** 2
    else:
        raise ValueError(f"task must be 'multiclass', 'binary' or 'regression', got {kind!r}")
    per = per.reshape(-1, per.shape[-1])
    w = row_weight(per.dtype) if row_weight is not None else None
    if w is not None:
        return torch.mv(per, w), counts
    return (per.reshape(-1) if per.shape[-1] == 1 else per.mean(-1)), counts


def _step_means(rows: torch.Tensor, counts: tuple[int, ...]) -> torch.Tensor:
    """Each step's mean of its rows (counts[i] rows for step i, in order)."""
    if len(set(counts)) == 1:  # steps of one size: a row per step
        return rows.reshape(len(counts), -1).mean(1)
    # steps of several sizes (an epoch's last, shorter batch): each step's mean as one product
    # with a matrix of 1/count over its rows (made once per set of sizes), else one segmented mean
    if len(counts) * rows.numel() > _MEANS_LIMIT:
        return torch.segment_reduce(rows, "mean", lengths=torch.tensor(counts, device=rows.device))
    return torch.mv(_step_means_matrix(counts, rows.dtype, rows.device), rows)


_MEANS_LIMIT = 1 << 20  # entries of the largest matrix `_step_means_matrix` makes


@functools.lru_cache(maxsize=32)
def _step_means_matrix(counts: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[steps, Σ counts]: row i holds 1/counts[i] over step i's elements and 0 elsewhere."""
    step_of = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    m = (step_of.unsqueeze(0) == torch.arange(len(counts)).unsqueeze(1)).to(dtype)
    return (m / torch.tensor(counts, dtype=dtype).unsqueeze(1)).to(device)
