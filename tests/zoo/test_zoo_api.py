"""The zoo's import API and `penrose zoo list`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import penrose
import penrose_zoo
from penrose.cli import main

ZOO = Path(penrose_zoo.__file__).resolve().parent


def test_every_model_in_two_lines():
    for name, entry in penrose_zoo.MODELS.items():
        model = entry.build()
        out = model(**entry.example_inputs(batch=2))
        y = out if isinstance(out, torch.Tensor) else out[0]
        assert y.shape[0] == 2, name
        assert torch.isfinite(y).all(), name


def test_entries_cover_the_issue():
    assert set(penrose_zoo.MODELS) == {
        "linear", "mlp", "self_attention", "causal_self_attention", "sparse_autoencoder",
        "topk_sparse_autoencoder", "concept_bottleneck", "concept_bottleneck_logit",
        "concept_bottleneck_hybrid", "concept_bottleneck_typed", "concept_embedding", "concept_embedding_typed", "concept_graph",
        "concept_graph_input", "causally_reliable_cbm",
        "concept_whitening", "prototype_concepts", "neural_additive", "mixture_of_linear_models", "mixture_typed", "senn", "cav_probe",
    }


def test_params_registered_under_diagram_names():
    model = penrose_zoo.MODELS["concept_bottleneck"].build(f=4, k=2)
    assert sorted(n for n, _ in model.named_parameters()) == [
        "diagram.W_c", "diagram.W_y", "diagram.b_c", "diagram.b_y"]
    checked = penrose.load(ZOO / "concept_bottleneck_model.pen", f=4, k=2)
    assert sum(p.numel() for p in model.parameters()) == checked.param_count()


def test_build_is_deterministic_under_seed():
    a = penrose_zoo.MODELS["neural_additive"].build(seed=3)
    b = penrose_zoo.MODELS["neural_additive"].build(seed=3)
    c = penrose_zoo.MODELS["neural_additive"].build(seed=4)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n
    assert any(not torch.equal(p, r) for p, r in zip(a.parameters(), c.parameters()))


def test_every_diagram_has_an_index_legend_and_wrapper_docstring():
    for entry in penrose_zoo.MODELS.values():
        text = (ZOO / entry.cls.diagram_file).read_text()
        assert text.startswith("# index legend:"), entry.name
        assert "Index legend" in (entry.cls.__doc__ or "") or "legend" in (entry.cls.__doc__ or "").lower(), entry.name


def test_no_layers_in_wrappers():
    """Wrappers hold the compiled diagram only: no nn.Linear / nn.Parameter of their own."""
    for entry in penrose_zoo.MODELS.values():
        model = entry.build()
        own = [n for n, _ in model.named_parameters() if not n.startswith("diagram.")]
        assert not own, (entry.name, own)
        assert not any(isinstance(m, torch.nn.Linear) for m in model.modules()), entry.name


def test_list_lines_and_cli(capsys):
    lines = penrose_zoo.list_lines()
    assert lines[0].split()[:2] == ["model", "params"]
    assert [l.split()[0] for l in lines[1:]] == list(penrose_zoo.MODELS)
    counts = {l.split()[0]: int(l.split()[1].replace(",", "")) for l in lines[1:] if "M" not in l.split()[1]}
    for name, n in counts.items():
        assert n == sum(p.numel() for p in penrose_zoo.MODELS[name].build().parameters()), name
    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == lines


def test_state_dict_roundtrip():
    a = penrose_zoo.MODELS["prototype_concepts"].build(f=6, seed=1)
    b = penrose_zoo.MODELS["prototype_concepts"].build(f=6, seed=2)
    b.load_state_dict(a.state_dict())
    inputs = a.example_inputs(3)
    torch.testing.assert_close(a(**inputs).y, b(**inputs).y)
    assert "diagram.pi" in a.state_dict()  # prototype labels travel with the model


def test_docs_zoo_python_examples_run():
    text = (ZOO.parent / "docs" / "zoo.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    for body in blocks:
        exec(compile(body, "docs/zoo.md", "exec"), {})


@pytest.mark.parametrize("module", [
    "penrose_zoo.core", "penrose_zoo.linear", "penrose_zoo.mlp", "penrose_zoo.self_attention",
    "penrose_zoo.sparse_autoencoder", "penrose_zoo.concept_bottleneck_model", "penrose_zoo.concept_embedding_model",
    "penrose_zoo.prototype_concept_model", "penrose_zoo.neural_additive_model", "penrose_zoo.mixture_of_linear_models",
    "penrose_zoo", "penrose_zoo.plots", "penrose_zoo.cli", "penrose_zoo.validate",
    "penrose_zoo.concept_graph_model", "penrose_zoo.causally_reliable_cbm",
])
def test_docstring_examples(module):
    import doctest
    import importlib

    mod = importlib.import_module(module)
    result = doctest.testmod(mod, extraglobs={"torch": torch}, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
