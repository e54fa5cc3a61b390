"""Bad input gets a clear error naming the tensor and the index (or leg) at fault."""

from __future__ import annotations

import pytest
import torch

import penrose_zoo
from penrose import PenroseShapeError
from penrose_zoo import InterventionError
from penrose_zoo.train import NonFiniteInputError


def test_wrong_feature_size_names_input_and_leg():
    model = penrose_zoo.LinearModel(f=5)
    with pytest.raises(PenroseShapeError, match=r"input 'x' leg 'f' must have size 5, got 7"):
        model(torch.randn(4, 7))


def test_attention_wrong_embedding_size():
    model = penrose_zoo.SelfAttention(e=8, h=2, d=4)
    with pytest.raises(PenroseShapeError, match=r"input 'Z' leg 'e' must have size 8, got 6"):
        model(torch.randn(2, 5, 6))
    with pytest.raises(PenroseShapeError, match=r"input 'Z' has 1 dimension\(s\) but needs at least 2"):
        model(torch.randn(8))


def test_concept_inputs_wrong_shape_and_dtype():
    model = penrose_zoo.ConceptBottleneckModel(f=5, k=3)
    x = torch.randn(4, 5)
    with pytest.raises(PenroseShapeError, match=r"input 'c_true' leg 'k' must have size 3, got 4"):
        model(x, c_true=torch.zeros(4, 4), do=torch.zeros(4, 3, dtype=torch.bool))
    with pytest.raises(PenroseShapeError, match=r"input 'do' must be a bool mask"):
        model(x, c_true=torch.zeros(4, 3), do=torch.zeros(4, 3))
    with pytest.raises(PenroseShapeError, match=r"input 'c_true' has batch shape \(3,\) but input 'x' has \(4,\)"):
        model(x, c_true=torch.zeros(3, 3), do=torch.zeros(3, 3, dtype=torch.bool))
    with pytest.raises(InterventionError, match="needs the values 'c_true'"):
        model(x, do=torch.zeros(3, dtype=torch.bool))


@pytest.mark.parametrize("name", ["concept_bottleneck", "concept_embedding", "prototype_concepts",
                                  "mixture_of_linear_models"])
def test_out_of_range_concept_ids(name):
    model = penrose_zoo.MODELS[name].build(f=5, k=3)
    x = torch.randn(2, 5)
    with pytest.raises(InterventionError, match=r"concepts\[1\] = 3 is out of range: the model has k = 3 concepts \(ids 0\.\.2\)"):
        model.intervene(x, [0, 3], [1.0, 0.0])
    with pytest.raises(InterventionError, match=r"concepts\[0\] = -1 is out of range"):
        model.intervene(x, [-1], [1.0])
    with pytest.raises(InterventionError, match=r"concepts\[0\] = 'nope' is not a concept name"):
        model.intervene(x, ["nope"], [1.0])
    with pytest.raises(InterventionError, match=r"non-finite value at index \(1,\)"):
        model.intervene(x, [0, 1], [1.0, float("nan")])
    with pytest.raises(InterventionError, match=r"2 entries .* but 1 concepts"):
        model.intervene(x, [0], [1.0, 0.0])


def test_interventions_by_id_name_and_per_example_values():
    model = penrose_zoo.ConceptBottleneckModel(f=5, k=3, concept_names=("red", "round", "big"))
    x = torch.randn(2, 5)
    out = model.intervene(x, ["round", 2], torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    assert out.c[:, 1].tolist() == [1.0, 0.0] and out.c[:, 2].tolist() == [0.0, 1.0]
    torch.testing.assert_close(out.c[:, 0], torch.sigmoid(out.c_logit[:, 0]))


def test_nan_training_input_names_tensor_and_index():
    model = penrose_zoo.ConceptBottleneckModel(f=5, k=3)
    x = torch.randn(10, 5)
    x[7, 2] = float("nan")
    c = torch.zeros(10, 3)
    y = torch.zeros(10, dtype=torch.long)
    with pytest.raises(NonFiniteInputError, match=r"x_train \(train_data\[0\]\) has NaN at index \(7, 2\)"):
        model.fit((x, c, y), epochs=1, batch_size=4, lr=1e-2, progress=False)
    c[3, 1] = float("inf")
    x[7, 2] = 0.0
    with pytest.raises(NonFiniteInputError, match=r"c_train \(train_data\[1\]\) has inf at index \(3, 1\)"):
        model.fit((x, c, y), epochs=1, batch_size=4, lr=1e-2, progress=False)


def test_unknown_size_and_bad_task():
    with pytest.raises(TypeError, match="unknown size 'q'.*declares f, r"):
        penrose_zoo.LinearModel(q=3)
    with pytest.raises(ValueError, match="binary task needs r = 1"):
        penrose_zoo.LinearModel(r=2)
    with pytest.raises(ValueError, match="modes"):
        penrose_zoo.ConceptEmbeddingModel(f=3, k=2).fit((torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2).long()),
                                                mode="independent", epochs=1, batch_size=1, lr=0.1)
