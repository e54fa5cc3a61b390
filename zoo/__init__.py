"""The zoo: complete, trainable interpretable models, each generated from its `.pen` diagram.

    >>> import penrose_zoo
    >>> entry = penrose_zoo.MODELS["concept_bottleneck"]
    >>> out = entry.build(f=20)(**entry.example_inputs(batch=2, f=20))
    >>> out.y.shape
    torch.Size([2, 2])

`penrose_zoo.MODELS` maps each name to a `ModelEntry` (`build(**sizes)`, `example_inputs(batch)`,
`param_count()`); `penrose_zoo.list_lines()` is what `penrose zoo list` prints. Every model is a
thin wrapper (`zoo/<name>.py`) around its diagram (`zoo/<name>.pen`); docs/zoo.md has the
index legends, training results and the commands that reproduce them.

The folder is zoo/, the import name penrose_zoo (pyproject.toml's package-dir maps one to the
other), so the wheel installs no generic top-level `zoo`.
"""

if __name__ != "penrose_zoo":  # `import zoo` from the repository root would make a second copy
    raise ImportError(f"the zoo's import name is penrose_zoo, not {__name__}: `import penrose_zoo`")

from penrose_zoo.cav_probe import ConceptActivationVectors
from penrose_zoo.concept_bottleneck_model import (
    ConceptBottleneckModel,
    HybridConceptBottleneckModel,
    LogitConceptBottleneckModel,
    TypedConceptBottleneckModel,
)
from penrose_zoo.concept_embedding_model import ConceptEmbeddingModel, TypedConceptEmbeddingModel
from penrose_zoo.causally_reliable_cbm import CausallyReliableCBM
from penrose_zoo.concept_graph_input_model import InputConceptGraphModel
from penrose_zoo.concept_graph_model import ConceptGraphModel
from penrose_zoo.concept_whitening import ConceptWhiteningModel
from penrose_zoo.core import Explanation, InterventionError, ModelEntry, ZooModel
from penrose_zoo.core import list_lines as _list_lines
from penrose_zoo.linear import LinearModel
from penrose_zoo.mixture_of_linear_models import MixtureOfLinearModels, TypedMixtureOfLinearModels
from penrose_zoo.mlp import MLP
from penrose_zoo.neural_additive_model import NeuralAdditiveModel
from penrose_zoo.prototype_concept_model import PrototypeConceptModel
from penrose_zoo.self_attention import CausalSelfAttention, SelfAttention
from penrose_zoo.senn import SelfExplainingNetwork
from penrose_zoo.sparse_autoencoder import SparseAutoencoder, TopKSparseAutoencoder

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
    ModelEntry("concept_bottleneck_logit", LogitConceptBottleneckModel,
               "concept bottleneck carrying logits; interventions at training-logit percentiles", "toy sets"),
    ModelEntry("concept_bottleneck_hybrid", HybridConceptBottleneckModel,
               "concept bottleneck + extra unsupervised units (leaky ReLU) the task also reads", "toy sets"),
    ModelEntry("concept_bottleneck_typed", TypedConceptBottleneckModel,
               "concept bottleneck over binary, categorical (grouped softmax) and continuous concepts", "toy sets"),
    ModelEntry("concept_embedding", ConceptEmbeddingModel,
               "concept embedding model: ± embeddings mixed by concept probabilities, RandInt", "fortunes"),
    ModelEntry("concept_embedding_typed", TypedConceptEmbeddingModel,
               "concept embedding model over binary, categorical (grouped softmax) and continuous concepts", "toy sets"),
    ModelEntry("concept_graph", ConceptGraphModel,
               "concept graph model: roots from the input, every other concept and the task from their parents",
               "checkmark"),
    ModelEntry("concept_graph_input", InputConceptGraphModel,
               "input-reading graph bottleneck: every concept from the input and its parents in a given DAG",
               "checkmark"),
    ModelEntry("causally_reliable_cbm", CausallyReliableCBM,
               "causally reliable CBM (C2BM): per-concept embeddings, hypernetworks over the parents", "checkmark"),
    ModelEntry("concept_whitening", ConceptWhiteningModel,
               "concept whitening: ZCA-whitened input rotated so that k axes align with concepts", "toy sets"),
    ModelEntry("prototype_concepts", PrototypeConceptModel,
               "prototype concept map: cosine to labelled prototypes, softmax, convex label mix", "fortunes"),
    ModelEntry("neural_additive", NeuralAdditiveModel,
               "neural additive model: ExU per-feature networks as one einsum, feature dropout", "breast_cancer"),
    ModelEntry("mixture_of_linear_models", MixtureOfLinearModels,
               "concept memory: slot selector + a linear model over concepts per slot", "fortunes"),
    ModelEntry("mixture_typed", TypedMixtureOfLinearModels,
               "concept memory over binary, categorical (grouped softmax) and continuous concepts", "toy sets"),
    ModelEntry("senn", SelfExplainingNetwork,
               "self-explaining network: concepts h(x) times relevances theta(x), robustness penalty",
               "breast_cancer"),
    ModelEntry("cav_probe", ConceptActivationVectors,
               "concept activation vectors: linear probes on a layer + the head TCAV differentiates",
               "fortunes"),
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
    "LogitConceptBottleneckModel",
    "HybridConceptBottleneckModel",
    "TypedConceptBottleneckModel",
    "ConceptEmbeddingModel",
    "TypedConceptEmbeddingModel",
    "ConceptGraphModel",
    "InputConceptGraphModel",
    "CausallyReliableCBM",
    "ConceptWhiteningModel",
    "PrototypeConceptModel",
    "NeuralAdditiveModel",
    "MixtureOfLinearModels",
    "TypedMixtureOfLinearModels",
    "SelfExplainingNetwork",
    "ConceptActivationVectors",
]
