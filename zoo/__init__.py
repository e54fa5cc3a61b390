"""The zoo: complete, trainable interpretable models, each generated from its `.pen` diagram.

    >>> import zoo
    >>> entry = zoo.MODELS["concept_bottleneck"]
    >>> out = entry.build(f=20)(**entry.example_inputs(batch=2, f=20))
    >>> out.y.shape
    torch.Size([2, 2])

`zoo.MODELS` maps each name to a `ModelEntry` (`build(**sizes)`, `example_inputs(batch)`,
`param_count()`); `zoo.list_lines()` is what `penrose zoo list` prints. Every model is a thin
wrapper (`zoo/<name>.py`) around its diagram (`zoo/<name>.pen`); docs/zoo.md has the
index legends, training results and the commands that reproduce them.
"""

from zoo.concept_bottleneck_model import ConceptBottleneckModel
from zoo.concept_embedding_model import ConceptEmbeddingModel
from zoo.core import Explanation, InterventionError, ModelEntry, ZooModel
from zoo.core import list_lines as _list_lines
from zoo.linear import LinearModel
from zoo.mixture_of_linear_models import MixtureOfLinearModels
from zoo.mlp import MLP
from zoo.neural_additive_model import NeuralAdditiveModel
from zoo.prototype_concept_model import PrototypeConceptModel
from zoo.self_attention import CausalSelfAttention, SelfAttention
from zoo.sparse_autoencoder import SparseAutoencoder, TopKSparseAutoencoder

_ENTRIES = [
    ModelEntry("linear", LinearModel, "linear model (logistic / softmax / least-squares regression)",
               "breast_cancer"),
    ModelEntry("mlp", MLP, "one hidden ReLU layer", "digits"),
    ModelEntry("self_attention", SelfAttention, "multi-head self-attention, bidirectional (heads as a leg)",
               "digits rows (masked row)"),
    ModelEntry("causal_self_attention", CausalSelfAttention, "multi-head self-attention, causal mask",
               "digits rows (next row)"),
    ModelEntry("sparse_autoencoder", SparseAutoencoder, "sparse autoencoder, ReLU + L1 penalty", "digits"),
    ModelEntry("topk_sparse_autoencoder", TopKSparseAutoencoder, "sparse autoencoder, top-k activation",
               "digits"),
    ModelEntry("concept_bottleneck", ConceptBottleneckModel,
               "concept bottleneck: concept predictor + linear task predictor, interventions", "fortunes"),
    ModelEntry("concept_embedding", ConceptEmbeddingModel,
               "concept embedding model: ± embeddings mixed by concept probabilities, RandInt", "fortunes"),
    ModelEntry("prototype_concepts", PrototypeConceptModel,
               "prototype concept map: cosine to labelled prototypes, softmax, convex label mix", "fortunes"),
    ModelEntry("neural_additive", NeuralAdditiveModel,
               "neural additive model: ExU per-feature networks as one einsum, feature dropout", "breast_cancer"),
    ModelEntry("mixture_of_linear_models", MixtureOfLinearModels,
               "concept memory: slot selector + a linear model over concepts per slot", "fortunes"),
]

#: name -> ModelEntry, in the order of docs/zoo.md.
MODELS = {e.name: e for e in _ENTRIES}


def list_lines() -> list[str]:
    """One line per model (name, parameter count at default sizes, diagram, summary), after a header.

    >>> list_lines()[1].split()[0]
    'linear'
    """
    return _list_lines(MODELS)


__all__ = [
    "MODELS",
    "ModelEntry",
    "ZooModel",
    "Explanation",
    "InterventionError",
    "list_lines",
    "LinearModel",
    "MLP",
    "SelfAttention",
    "CausalSelfAttention",
    "SparseAutoencoder",
    "TopKSparseAutoencoder",
    "ConceptBottleneckModel",
    "ConceptEmbeddingModel",
    "PrototypeConceptModel",
    "NeuralAdditiveModel",
    "MixtureOfLinearModels",
]
