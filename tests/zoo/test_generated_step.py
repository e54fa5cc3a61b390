"""Concept models training through the diagram's generated backward (`GeneratedStep`).

The generated step must be `model.loss(batch, mode).backward()` to the last bit of float64 noise:
the same loss, the same gradient of every parameter, the same RandInt draws, on every concept
model it covers, in every training mode and task; `fit` through it follows autograd's trajectory;
models it does not cover (their own loss, a fine-tuned backbone, a patched `loss`) fall back to
autograd and say why; `backward='generated'` insists and raises.
"""

from __future__ import annotations

import pytest
import torch

import penrose_zoo
from penrose.gradients import NoGeneratedBackward
from penrose_zoo.train import FlatAdam, fit

pytestmark = pytest.mark.usefixtures("one_thread")

F, K = 5, 3


def data(n=40, seed=0, task="multiclass", r=2, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, F, generator=g, dtype=dtype)
    c = (x[:, :K] + 0.3 * torch.randn(n, K, generator=g, dtype=dtype) > 0).to(dtype)
    if task == "multiclass":
        y = torch.randint(0, r, (n,), generator=g)
    elif task == "binary":
        y = (c.sum(-1) > 1).long()
    else:
        y = x.sum(-1)
    return x, c, y


MODELS = {
    "cbm": lambda **kw: penrose_zoo.ConceptBottleneckModel(f=F, k=K, **kw),
    "cbm_randint": lambda **kw: penrose_zoo.ConceptBottleneckModel(f=F, k=K, p_int=0.5, **kw),
    "cbm_randint_example": lambda **kw: penrose_zoo.ConceptBottleneckModel(f=F, k=K, p_int=0.5, randint="example", **kw),
    "logit": lambda **kw: penrose_zoo.LogitConceptBottleneckModel(f=F, k=K, **kw),
    "hybrid": lambda **kw: penrose_zoo.HybridConceptBottleneckModel(f=F, k=K, j=4, **kw),
    "cem": lambda **kw: penrose_zoo.ConceptEmbeddingModel(f=F, k=K, e=4, **kw),
    "mixture": lambda **kw: penrose_zoo.MixtureOfLinearModels(f=F, k=K, m=2, **kw),
    "graph_parents": lambda **kw: penrose_zoo.ConceptGraphModel(f=F, concept_names=["a", "b", "c"],
                                                                parents={"c": ["a", "b"]}, **kw),
    "c2bm": lambda **kw: penrose_zoo.CausallyReliableCBM(f=F, e=3, h=3, concept_names=["a", "b", "c"],
                                                         parents={"c": ["a", "b"]}, **kw),
    "graph": lambda **kw: penrose_zoo.InputConceptGraphModel(f=F, k=K, concept_names=["a", "b", "c"],
                                                        parents={"c": ["a", "b"]}, **kw),
    "weighted": lambda **kw: penrose_zoo.ConceptBottleneckModel(f=F, k=K, concept_weight=[0.5, 2.0, 4.0], **kw),
}


def model_of(name, task="multiclass", seed=0):
    r = 1 if task in ("binary", "regression") else 2
    return MODELS[name](r=r, task=task, seed=seed).double()


def grads_of(model):
    return {n: (p.grad.clone() if p.grad is not None else None) for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("mode", ["joint", "independent", "concepts", "task"])
def test_one_step_is_autograds(name, mode):
    """Loss and every parameter's gradient equal autograd's, RandInt's draws included."""
    for task in ("multiclass", "binary", "regression"):
        if name != "cbm" and task != "multiclass":
            continue
        model = model_of(name, task).train()
        batch = data(task=task)
        torch.manual_seed(7)
        model.zero_grad()
        want = model.loss(batch, mode)
        want.backward()
        want_grads = grads_of(model)
        after_autograd = torch.random.get_rng_state()
        model.zero_grad()
        step = model.generated_step(mode)
        torch.manual_seed(7)
        got = step.loss(batch)
        assert torch.equal(torch.random.get_rng_state(), after_autograd), "the step draws what autograd's loss draws"
        torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-12)
        for n, g in grads_of(model).items():
            w = want_grads[n]
            if w is None:
                assert g is None or not g.any(), n
                continue
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=lambda m: f"{name} {mode} {task}: gradient of {n}: {m}")


@pytest.mark.parametrize("sizes", [[16, 16, 16, 5], [16, 16], [5, 16, 9], [7]])
@pytest.mark.parametrize("name, task", [("cem", "multiclass"), ("cbm", "binary"), ("weighted", "regression"),
                                        ("cbm_randint_example", "binary")])
@pytest.mark.parametrize("segmented", [False, True])
def test_epoch_losses_are_each_steps_loss(sizes, name, task, segmented, monkeypatch):
    """Steps of several sizes: each step's mean as one matrix-vector product, or (past the
    matrix's size limit) one segmented mean."""
    import penrose_zoo.concepts as concepts

    if segmented:
        monkeypatch.setattr(concepts, "_MEANS_LIMIT", 0)
    model = model_of(name, task)
    step = model.generated_step("joint")
    batches = [data(n=n, seed=s, task=task) for s, n in enumerate(sizes)]
    want = []
    for b in batches:
        torch.manual_seed(3)
        want.append(model.loss(b).detach())
    for b in batches:
        torch.manual_seed(3)
        assert step(b) is None
    torch.testing.assert_close(step.epoch_losses(), torch.stack(want), rtol=1e-12, atol=1e-12)
    assert step.epoch_losses().numel() == 0  # taken


@pytest.mark.parametrize("name", ["cbm_randint", "cem", "graph"])
@pytest.mark.parametrize("mode", ["joint", "sequential"])
def test_fit_follows_autograds_trajectory(name, mode):
    x, c, y = data(n=70)
    runs = {}
    for backward in ("autograd", "generated"):
        model = model_of(name)
        h = model.fit((x, c, y), (x, c, y), mode=mode, epochs=3, concept_epochs=2, batch_size=16, lr=1e-2, seed=1,
                      progress=False, backward=backward)
        runs[backward] = (model, h)
    (a, ha), (g, hg) = runs["autograd"], runs["generated"]
    for (n, p), q in zip(a.named_parameters(), g.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-9, atol=1e-10, msg=lambda m: f"{n}: {m}")
    for h1, h2 in ([(ha, hg)] if mode == "joint" else [(ha["concepts"], hg["concepts"]), (ha["task"], hg["task"])]):
        torch.testing.assert_close(torch.tensor(h2["train_loss"]), torch.tensor(h1["train_loss"]), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(torch.tensor(h2["val_loss"]), torch.tensor(h1["val_loss"]), rtol=1e-10, atol=1e-12)
        assert h2["backward"] == "generated" and h1["backward"].startswith("autograd")


@pytest.mark.parametrize("mode", ["concepts", "task", "independent"])
@pytest.mark.parametrize("name, task", [("weighted", "binary"), ("cem", "multiclass"), ("cbm", "regression")])
def test_epoch_losses_in_every_mode(name, task, mode):
    """The losses computed together per example row (the task's and the weighted concepts',
    added where both are there) are each step's `loss(batch, mode)`, in the stages of sequential
    training too (one of the two terms alone, the concepts unweighted)."""
    model = model_of(name, task)
    step = model.generated_step(mode)
    batches = [data(n=n, seed=s, task=task) for s, n in enumerate([16, 16, 9])]
    want = [model.loss(b, mode).detach() for b in batches]
    for b in batches:
        step(b)
    torch.testing.assert_close(step.epoch_losses(), torch.stack(want), rtol=1e-12, atol=1e-12)


def test_step_losses_of_rows_that_do_not_line_up():
    """Regression guard for the row-wise sum: a task read per example and concepts per example
    and position have rows of different counts; each is then averaged per step on its own."""
    from penrose_zoo.concepts import _row_losses, _step_means

    g = torch.Generator().manual_seed(0)
    sizes = [4, 4, 3]
    zt = [torch.randn(n, 1, generator=g, dtype=torch.float64) for n in sizes]
    tt = [(torch.rand(n, 1, generator=g) > 0.5).double() for n in sizes]
    zc = [torch.randn(n, 5, 2, generator=g, dtype=torch.float64) for n in sizes]
    tc = [(torch.rand(n, 5, 2, generator=g) > 0.5).double() for n in sizes]
    w = torch.tensor([1.0, 3.0], dtype=torch.float64)
    task_rows, task_counts = _row_losses(zt, tt, "binary")
    concept_rows, concept_counts = _row_losses(zc, tc, "concepts", lambda dtype: (w / 2).to(dtype))
    assert task_counts == (4, 4, 3) and concept_counts == (20, 20, 15)
    got = _step_means(task_rows, task_counts) + _step_means(concept_rows, concept_counts)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    want = torch.stack([bce(a, b) + bce(c, d, weight=w) for a, b, c, d in zip(zt, tt, zc, tc)])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("randint", ["concept", "example"])
def test_randint_draw_is_rand_below_p_int(dtype, randint):
    """RandInt compares torch.rand with p_int held as a tensor (made once): the same mask as
    `torch.rand(shape) < p_int`, in the default dtype rand draws in; a changed p_int is read again."""
    model = penrose_zoo.ConceptBottleneckModel(f=F, k=K, p_int=0.3, randint=randint)
    c = torch.zeros(64, K)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        for p in (0.3, 0.1, 0.7):
            model.p_int = p
            torch.manual_seed(5)
            got = model.random_do(c)
            torch.manual_seed(5)
            want = torch.rand(64, K if randint == "concept" else 1) < p
            assert torch.equal(got, want.expand(64, K))
    finally:
        torch.set_default_dtype(old)


def test_loss_returns_its_own_steps_loss_after_deferred_steps():
    """Regression: `step.loss(batch)` after steps whose losses were still kept returned the first
    kept step's loss, and dropped the others from `epoch_losses`."""
    model = model_of("cbm")
    step = model.generated_step("joint")
    batches = [data(n=16, seed=s) for s in range(3)]
    want = [model.loss(b).detach() for b in batches]
    step(batches[0])
    step(batches[1])
    torch.testing.assert_close(step.loss(batches[2]), want[2], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(step.epoch_losses(), torch.stack(want), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("task", ["multiclass", "binary", "regression"])
def test_closed_form_loss_gradients_are_autograds(task):
    from penrose_zoo.core import bce_grad, task_loss, task_loss_grad

    g = torch.Generator().manual_seed(0)
    r = 3 if task == "multiclass" else 1
    y = torch.randn(2, 5, r, generator=g, dtype=torch.float64, requires_grad=True)
    target = {"multiclass": torch.randint(0, 3, (2, 5), generator=g), "binary": torch.randint(0, 2, (2, 5), generator=g),
              "regression": torch.randn(2, 5, generator=g, dtype=torch.float64)}[task]
    (want,) = torch.autograd.grad(task_loss(y, target, task), y)
    torch.testing.assert_close(task_loss_grad(y.detach(), target, task), want, rtol=1e-12, atol=1e-14)
    z = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    c = (torch.rand(6, 4, generator=g) > 0.5).double()
    w = torch.tensor([0.5, 1.0, 2.0, 3.0], dtype=torch.float64)
    for weight in (None, w):
        (want,) = torch.autograd.grad(torch.nn.functional.binary_cross_entropy_with_logits(z, c, weight=weight), z)
        torch.testing.assert_close(bce_grad(z.detach(), c, weight), want, rtol=1e-12, atol=1e-14)


def test_auto_is_generated_where_covered_and_says_why_not_elsewhere():
    x, c, y = data()
    assert model_of("cbm").fit((x, c, y), epochs=1, batch_size=16, lr=1e-2, progress=False)["backward"] == "generated"
    typed = penrose_zoo.TypedConceptBottleneckModel(f=F, r=2, seed=0).double()
    ex = typed.example_inputs(batch=8)
    labels = ex["c_true"].clone()
    labels[:, 2:5] = torch.eye(3, dtype=labels.dtype)[torch.arange(8) % 3]  # c2's one value of a, b, c
    h = typed.fit((ex["x"], labels, torch.zeros(8, dtype=torch.long)), epochs=1, batch_size=4, lr=1e-2, progress=False)
    assert h["backward"].startswith("autograd (") and "its own loss" in h["backward"]
    with pytest.raises(NoGeneratedBackward, match="its own loss"):
        typed.generated_step()
    proto = penrose_zoo.PrototypeConceptModel(f=F, k=K, r=2, seed=0).double()
    with pytest.raises(NoGeneratedBackward, match="concept loss terms"):
        proto.generated_step()
    h = proto.fit((x, c, y), epochs=1, batch_size=16, lr=1e-2, progress=False)
    assert "concept loss terms" in h["backward"]
    with pytest.raises(NoGeneratedBackward):
        proto.fit((x, c, y), epochs=1, batch_size=16, lr=1e-2, progress=False, backward="generated")
    with pytest.raises(ValueError, match="backward must be one of"):
        model_of("cbm").fit((x, c, y), epochs=1, batch_size=16, lr=1e-2, progress=False, backward="fast")


def test_a_patched_loss_is_honoured():
    """A `loss` set on the instance (a spy, a custom term) is what trains: autograd, not the step."""
    x, c, y = data()
    model = model_of("cbm")
    calls = []
    original = model.loss

    def loss(batch, mode="joint"):
        calls.append(mode)
        return original(batch, mode)

    model.loss = loss
    h = model.fit((x, c, y), epochs=1, batch_size=16, lr=1e-2, progress=False)
    assert calls and h["backward"].startswith("autograd")


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, F)

    def forward(self, z):
        return torch.tanh(self.lin(z))


@pytest.mark.parametrize("backbone_mode, backward", [("frozen", "generated"), ("cached", "generated"),
                                                     ("finetune", "autograd")])
def test_backbones(backbone_mode, backward):
    """A frozen or cached backbone trains the diagram through the generated step (the features
    are inputs); a fine-tuned one needs autograd through the backbone."""
    torch.manual_seed(0)
    z = torch.randn(48, 4, dtype=torch.float64)
    _, c, y = data(n=48)
    runs = []
    for how in ("autograd", "auto"):
        torch.manual_seed(0)
        net = Tiny().double()
        model = penrose_zoo.ConceptBottleneckModel(f=F, k=K, r=2, seed=0, backbone=net, backbone_mode=backbone_mode).double()
        h = model.fit((z, c, y), epochs=2, batch_size=16, lr=1e-2, progress=False, backward=how)
        runs.append((model, h))
    assert runs[1][1]["backward"].startswith(backward)
    for p, q in zip(runs[0][0].parameters(), runs[1][0].parameters()):
        torch.testing.assert_close(q, p, rtol=1e-9, atol=1e-10)


def test_whitening_trains_its_task_head_through_the_step():
    x, c, y = data(n=60)
    model = penrose_zoo.ConceptWhiteningModel(f=F, k=K, r=2, seed=0).double()
    h = model.fit((x, c, y), epochs=2, rounds=1, align_steps=2, batch_size=16, lr=1e-2, progress=False)
    assert h["backward"] == "generated"


def test_a_wrong_batch_gets_the_compiled_modules_error():
    from penrose import PenroseShapeError

    model = model_of("cbm")
    step = model.generated_step()
    x, c, y = data()
    with pytest.raises((PenroseShapeError, ValueError), match="must have size|leg"):
        step((x[:, :4], c, y))


def test_fit_refuses_a_step_without_its_losses():
    model = model_of("cbm")
    x, c, y = data()
    with pytest.raises(ValueError, match="no loss and has no epoch_losses"):
        fit(model, lambda m, b: m.loss(b), (x, c, y), epochs=1, batch_size=16, lr=1e-2, progress=False,
            step_fn=lambda batch: None)

    class Short:
        def __call__(self, batch):
            return None

        def epoch_losses(self):
            return torch.zeros(1)

    with pytest.raises(ValueError, match="gave 1 losses for the 3 steps"):
        fit(model, lambda m, b: m.loss(b), (x, c, y), epochs=1, batch_size=16, lr=1e-2, progress=False, step_fn=Short())


def test_a_non_finite_loss_given_per_epoch_names_its_step():
    """Regression: with the losses given per epoch (none per step), the failing step was counted
    back from the number of per-step losses (zero) and named a step past the epoch."""
    from penrose_zoo.train import NonFiniteLossError

    model = model_of("cbm")
    x, c, y = data()

    class Step:
        def __call__(self, batch):
            return None

        def epoch_losses(self):
            return torch.tensor([0.5, float("nan"), 0.25])

    with pytest.raises(NonFiniteLossError) as e:
        fit(model, lambda m, b: m.loss(b), (x, c, y), epochs=2, batch_size=16, lr=1e-2, progress=False, step_fn=Step())
    assert (e.value.step, e.value.epoch) == (1, 1)


@pytest.mark.parametrize("weight_decay, decoupled", [(0.0, False), (0.1, False), (0.1, True)])
def test_flat_adams_fused_kernel_and_its_six_operations_agree(weight_decay, decoupled):
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(5, 3, dtype=torch.float64)), torch.nn.Parameter(torch.randn(3, dtype=torch.float64))]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    fused, plain = FlatAdam(ps, 1e-2, weight_decay, decoupled=decoupled), FlatAdam(qs, 1e-2, weight_decay, decoupled=decoupled)
    assert fused._fused is not None
    plain._fused = None
    for _ in range(20):
        g = [torch.randn(p.shape, dtype=torch.float64) for p in ps]
        for p, q, gi in zip(ps, qs, g):
            p.grad.copy_(gi)
            q.grad.copy_(gi)
        fused.step()
        plain.step()
    torch.testing.assert_close(fused.flat, plain.flat, rtol=1e-12, atol=1e-14)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("name", ["cbm_randint", "cem", "graph"])
def test_one_step_is_autograds_on_cuda(name):
    """The same step on CUDA in float32 (TF32 off): loss and gradients within 1e-5 of autograd's."""
    torch.backends.cuda.matmul.allow_tf32 = False
    model = MODELS[name](r=2, task="multiclass", seed=0).cuda().train()
    batch = tuple(t.cuda() for t in data(dtype=torch.float32))
    torch.manual_seed(7)
    want = model.loss(batch)
    want.backward()
    want_grads = grads_of(model)
    model.zero_grad()
    torch.manual_seed(7)
    got = model.generated_step().loss(batch)
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
    for n, g in grads_of(model).items():
        if want_grads[n] is not None:
            torch.testing.assert_close(g, want_grads[n], rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: gradient of {n}: {m}")


def test_fit_flushes_subnormals_while_it_trains_and_not_after():
    seen = []

    def loss(model, batch):
        seen.append((torch.tensor([1e-39]) * 1.0).item())
        return model.loss(batch)

    model = model_of("cbm").float()
    x, c, y = data(dtype=torch.float32)
    fit(model, loss, (x, c, y), epochs=1, batch_size=16, lr=1e-2, progress=False)
    assert seen and all(v == 0.0 for v in seen)
    assert (torch.tensor([1e-39]) * 1.0).item() > 0  # off again
    seen.clear()
    fit(model, loss, (x, c, y), epochs=1, batch_size=16, lr=1e-2, progress=False, flush_denormal=False)
    assert seen and all(v > 0 for v in seen)


def test_the_step_is_planned_with_what_does_not_change_fixed():
    """Without RandInt the mask (and, where nothing else reads them, the labels it sets) are
    fixed when planning: the step takes x alone and the where is folded away; RandInt's step
    takes the labels and the drawn mask; independent training fixes the mask all True."""
    x, c, y = data(n=16)
    plain = model_of("cbm").train()
    step = plain.generated_step("joint")
    step((x, c, y))
    assert step._steps[False].inputs == ["x"]
    randint = model_of("cbm_randint").train()
    step = randint.generated_step("joint")
    step((x, c, y))
    assert step._steps[True].inputs == ["x", "c_true", "do"]
    step = plain.generated_step("independent")
    step((x, c, y))
    assert step._steps[False].inputs == ["x", "c_true"]


def test_fit_runs_a_step_without_autograd_under_no_grad():
    """A step_fn with `uses_autograd = False` (GeneratedStep) runs inside torch.no_grad();
    any other step_fn with gradients on, as it may build a graph of its own."""
    x, c, y = data(n=20)
    seen = {}

    class Step:
        def __init__(self, model, uses):
            self.model, self.key = model, uses
            if uses is not None:
                self.uses_autograd = uses

        def __call__(self, batch):
            seen.setdefault(self.key, set()).add(torch.is_grad_enabled())
            loss = self.model.loss(batch) if torch.is_grad_enabled() else None
            if loss is not None:
                loss.backward()
                return loss
            with torch.enable_grad():
                loss = self.model.loss(batch)
                loss.backward()
            return loss

    for uses in (False, True, None):
        model = model_of("cbm")
        fit(model, lambda m, b: m.loss(b), (x, c, y), epochs=1, batch_size=8, lr=1e-2, progress=False,
            step_fn=Step(model, uses))
    assert seen == {False: {False}, True: {True}, None: {True}}


def test_prepare_gives_the_targets_their_float_column_once_and_fit_uses_it():
    """`GeneratedStep.prepare`: integer binary targets become the model's float dtype as a
    column [n, 1] (what the loss gradient converted and reshaped at every step); a fit through
    it follows autograd's trajectory, losses included."""
    x, c, y = data(n=50, task="binary")
    model = model_of("cbm", "binary")
    step = model.generated_step("joint")
    px, pc, py = step.prepare((x, c, y))
    assert px is x and pc is c and py.dtype == torch.float64 and py.shape == (50, 1)
    assert torch.equal(py[:, 0], y.double())
    assert model_of("cbm").generated_step("joint").prepare((x, c, y))[2] is y  # class ids stay ids
    assert step.prepare((x, c, y.double().unsqueeze(-1)))[2].shape == (50, 1)
    runs = {}
    for backward in ("autograd", "generated"):
        m = model_of("cbm", "binary")
        runs[backward] = (m, m.fit((x, c, y), epochs=3, batch_size=16, lr=1e-2, seed=2, progress=False,
                                   backward=backward))
    (a, ha), (g, hg) = runs["autograd"], runs["generated"]
    assert hg["backward"] == "generated"
    for (n, p), q in zip(a.named_parameters(), g.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-9, atol=1e-10, msg=lambda m: f"{n}: {m}")
    torch.testing.assert_close(torch.tensor(hg["train_loss"]), torch.tensor(ha["train_loss"]), rtol=1e-10, atol=1e-12)


def test_fit_refuses_a_prepare_that_changes_the_rows():
    x, c, y = data(n=20)
    model = model_of("cbm")

    class Bad:
        uses_autograd = False

        def __call__(self, batch):
            return None

        def prepare(self, tensors):
            return tuple(t[:10] for t in tensors)

    with pytest.raises(ValueError, match="prepare must give one tensor per training tensor, with the same rows"):
        fit(model, lambda m, b: m.loss(b), (x, c, y), epochs=1, batch_size=8, lr=1e-2, progress=False, step_fn=Bad())
