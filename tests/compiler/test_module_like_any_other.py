"""A compiled diagram is a PyTorch module like any other (issue 35): its classes live in an
importable module (penrose.generated), so it pickles as itself — to another process too —,
deep-copies, and compiles with torch.compile inside a user's own module, fullgraph, with a
dynamic batch, equal to eager. The zoo's models and Steerling at a small config likewise.

Each case is held the way users hold a model: nested in their own nn.Module, saved whole with
torch.save and loaded in a fresh interpreter, sent to a spawned worker."""

from __future__ import annotations

import copy
import importlib
import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import penrose
import penrose_zoo
from penrose_zoo.steerling import Steerling

TEXT = """\
# e input, f hidden, r output
dim e = 5, f = 6, r = 3
input x[e]
param W[e, f] ~ normal(std=0.5)
param b[f]
param V[f, r] ~ normal(std=0.5)
block act(h[f]) {
  param s[f] ~ ones
  return tanh(h) * s
}
h = einsum('e,ef->f', x, W) + b
a = act(h) repeat 2 as acts
y = einsum('f,fr->r', a, V) / sqrt(f)
output y
"""

SMALL_MODEL = dict(n_layers=2, n_head=2, n_kv_heads=1, n_embd=16, block_size=32, diff_block_size=4, intermediate_size=24)
SMALL_CONCEPT = dict(n_concepts=6, n_unknown_concepts=8, concept_dim=16, topk_known=2, topk_known_features=2,
                     factorize_rank=4, unknown_topk=2, block_size=4, pad_multiple=4)


class Users(nn.Module):
    """A user's own model: a torch layer, a compiled diagram, another torch layer."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(4, 5)
        self.diagram = penrose.compile(TEXT, seed=0)
        self.post = nn.Linear(3, 2)

    def forward(self, x):
        return self.post(self.diagram(torch.relu(self.pre(x))))


def _leaves(out) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _assert_same(a, b, atol=0.0):
    la, lb = _leaves(a), _leaves(b)
    assert len(la) == len(lb) and la
    for x, y in zip(la, lb):
        torch.testing.assert_close(x, y, atol=atol, rtol=0 if atol == 0 else 1e-5)


def test_generated_classes_live_in_an_importable_module():
    m = penrose.compile(TEXT, seed=0)
    name = type(m).__module__
    assert name.startswith("penrose.generated.")
    module = importlib.import_module(name)
    assert module.Model is type(m) and type(m.acts[0]).__module__ == name
    # the same diagram at the same sizes is the same module; other sizes another one
    assert type(penrose.compile(TEXT, seed=1)) is type(m)
    assert type(penrose.compile(TEXT, e=7)).__module__ != name


def test_regression_nested_diagram_under_torch_compile():
    """torch.compile(nn.Sequential(..., penrose.compile(...))) raised InternalTorchDynamoError:
    No module named 'penrose_generated_1' (the class claimed a module nobody could import)."""
    torch.manual_seed(0)
    model = Users().eval()
    compiled = torch.compile(model, backend="eager", fullgraph=True, dynamic=True)
    for batch in (3, 7):
        x = torch.randn(batch, 4)
        _assert_same(compiled(x), model(x), atol=1e-6)
    seq = nn.Sequential(nn.Linear(5, 5), penrose.compile(TEXT, seed=0))
    x = torch.randn(2, 5)
    _assert_same(torch.compile(seq, backend="eager", fullgraph=True)(x), seq(x), atol=1e-6)


def test_nested_diagram_under_inductor_with_gradients():
    """The default backend (inductor) on a user's module holding a diagram: values and gradients."""
    torch.manual_seed(0)
    model = Users()
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin, fullgraph=True, dynamic=True)
    x = torch.randn(6, 4)
    _assert_same(compiled(x), model(x), atol=1e-5)
    model(x).square().sum().backward()
    compiled(x).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-5, msg=name)


def test_regression_pickle_and_deepcopy_of_a_compiled_diagram():
    """pickle.dumps(model) raised PicklingError: Can't pickle <class 'penrose_generated_1.Diagram'>."""
    m = penrose.compile(TEXT, seed=0)
    with torch.no_grad():
        m.acts[1].s.mul_(3)  # state the recipe does not know: the pickle must carry it
    x = torch.randn(4, 5)
    for twin in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert type(twin) is type(m) and twin is not m
        _assert_same(twin(x), m(x))
        assert twin.penrose_checked is not None and twin.penrose_source == m.penrose_source
        assert not twin.acts[1].s.data_ptr() == m.acts[1].s.data_ptr()


_FRESH = textwrap.dedent("""
    import dataclasses, sys, torch
    torch.set_num_threads(int(sys.argv[2]))  # the saving process's: bit for bit needs the same reduction order
    def leaves(out):
        if dataclasses.is_dataclass(out):
            out = [getattr(out, f.name) for f in dataclasses.fields(out)]
        return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    for name, (model, x, y) in torch.load(sys.argv[1], weights_only=False).items():
        out = model(x) if isinstance(x, torch.Tensor) else model(**x)
        assert len(leaves(out)) == len(leaves(y)) > 0, name
        assert all(torch.equal(a, b) for a, b in zip(leaves(out), leaves(y))), name + ": outputs differ"
        print(name, type(model).__module__, type(model).__name__)
""")


def test_torch_save_whole_models_and_load_in_a_fresh_process(tmp_path):
    """A user's module holding a diagram, zoo models and Steerling: torch.save in this process,
    torch.load(weights_only=False) in a fresh interpreter, the same outputs bit for bit (with as many threads:
    the suite runs on one, set when the steerling tests are collected, and prototype_concepts' sums then
    differ in their last bit from two threads')."""
    torch.manual_seed(0)
    cases: dict = {"users": (Users().eval(), torch.randn(3, 4))}
    for name in ("concept_bottleneck", "concept_embedding", "prototype_concepts"):
        entry = penrose_zoo.MODELS[name]
        cases[name] = (entry.build().eval(), entry.example_inputs(batch=3))
    steer = Steerling(SMALL_MODEL, SMALL_CONCEPT, 260, seed=0).eval()
    cases["steerling"] = (steer, torch.randint(0, 260, (2, 8)))
    saved = {name: (model, x, model(x) if isinstance(x, torch.Tensor) else model(**x)) for name, (model, x) in cases.items()}
    torch.save(saved, tmp_path / "models.pt")
    # the user's own class (Users, here) is importable there, as any pickled class must be
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _FRESH, str(tmp_path / "models.pt"), str(torch.get_num_threads())], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [line.split() for line in done.stdout.splitlines()]
    assert printed == [[name, type(model).__module__, type(model).__name__] for name, (model, _) in cases.items()]


def _run_in_worker(model, x):
    with torch.no_grad():
        return model(x)


def test_model_sent_to_a_spawned_worker():
    model = Users().eval()
    x = torch.randn(2, 4)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        out = pool.apply(_run_in_worker, (model, x))
    _assert_same(out, model(x))


@pytest.mark.parametrize("name", sorted(penrose_zoo.MODELS))
def test_every_zoo_model_pickles_as_itself_and_compiles_fullgraph(name):
    """Each zoo model: pickled and copied as its own class; torch.compile(fullgraph=True,
    dynamic=True) equal to eager at two batch sizes (the graph is captured whole: a break fails)."""
    entry = penrose_zoo.MODELS[name]
    torch.manual_seed(0)
    model = entry.build().eval()
    inputs = entry.example_inputs(batch=3)
    twin = pickle.loads(pickle.dumps(model))
    assert type(twin) is type(model) and type(twin.diagram) is type(model.diagram)
    _assert_same(twin(**inputs), model(**inputs))
    compiled = torch.compile(model, backend="eager", fullgraph=True, dynamic=True)
    for batch in (3, 5):
        inputs = entry.example_inputs(batch=batch)
        _assert_same(compiled(**inputs), model(**inputs), atol=1e-6)


def test_steerling_small_config_compiles_fullgraph_and_breaks_only_where_documented():
    """Steerling at a small config: forward without interventions and with dense heads compiles
    fullgraph with a dynamic batch and length; an intervention through a blocked head (rows
    selected by the data) is the documented graph break: it compiles without fullgraph, equal."""
    torch.manual_seed(0)
    model = Steerling(SMALL_MODEL, SMALL_CONCEPT, 260, seed=0).eval()
    full = torch.compile(model, backend="eager", fullgraph=True, dynamic=True)
    for shape in ((2, 8), (3, 16)):
        ids = torch.randint(0, 260, shape)
        _assert_same(full(ids).logits, model(ids).logits, atol=1e-5)
        dense = dict(intervene_known={1: 2.0}, dense_heads=True)
        _assert_same(full(ids, **dense).logits, model(ids, **dense).logits, atol=1e-5)
    with pytest.raises(RuntimeError, match="out of range for vocab_size 260"):  # the id check runs in the graph
        full(torch.full((2, 8), 300))
    ids = torch.randint(0, 260, (2, 8))
    with pytest.raises(Exception, match="data-dependent"):
        full(ids, intervene_unknown={2: 0.0})
    broken = torch.compile(model, backend="eager", dynamic=True)
    _assert_same(broken(ids, intervene_unknown={2: 0.0}).logits, model(ids, intervene_unknown={2: 0.0}).logits, atol=1e-5)


@pytest.mark.parametrize("name", ["concept_embedding", "neural_additive"])
def test_zoo_model_in_train_mode_compiles_fullgraph(name):
    """Train mode draws at random inside forward: the concept embedding model's RandInt (each
    concept set to its true value with probability p_int when c_true is given without `do`) and
    the neural additive model's feature dropout. Both stay in one graph (fullgraph, dynamic
    batch), and under the same seed compiled and eager draw the same and agree."""
    entry = penrose_zoo.MODELS[name]
    torch.manual_seed(0)
    model = entry.build().train()
    compiled = torch.compile(model, backend="eager", fullgraph=True, dynamic=True)
    for batch in (3, 5):
        inputs = entry.example_inputs(batch=batch)
        inputs.pop("do", None)  # RandInt draws `do` itself
        torch.manual_seed(batch)
        want = model(**inputs)
        torch.manual_seed(batch)
        _assert_same(compiled(**inputs), want, atol=1e-6)
    torch.manual_seed(1)
    assert not all(torch.equal(a, b) for a, b in zip(_leaves(model(**inputs)), _leaves(want))), "train mode drew nothing"


def test_float_mask_attention_breaks_the_graph_only_under_autograd():
    """docs/pytorch.md's second listed break: attention with an additive float mask (the paper's
    Steerling listing) reads the mask's values under autograd (a row that hides every key is
    written out), so fullgraph fails there; under no_grad it is one graph; without fullgraph
    the pieces compile, equal to eager."""
    torch.manual_seed(0)
    model = penrose.compile(Path(penrose_zoo.__file__).parent / "paper" / "steerling_listing.pen", seed=0).eval()
    x = torch.randn(2, 8, 11)
    full = torch.compile(model, backend="eager", fullgraph=True, dynamic=True)
    with torch.no_grad():
        _assert_same(full(X=x), model(X=x), atol=1e-5)
    with pytest.raises(Exception, match="data-dependent"):
        full(X=x)
    _assert_same(torch.compile(model, backend="eager", dynamic=True)(X=x), model(X=x), atol=1e-5)
