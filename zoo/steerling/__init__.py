"""Steerling-8B, full, from diagrams: the released model (steerling 0.2.0) compiled from
zoo/steerling/*.pen. See docs/steerling.md."""

from penrose_zoo.steerling.model import (
    CONCEPT_DEFAULTS,
    MODEL_DEFAULTS,
    RELEASE_NAMES,
    RELEASE_VOCAB_SIZE,
    Steerling,
    SteerlingOutput,
    diagram_sizes,
    release_key,
    release_names,
)

__all__ = [
    "CONCEPT_DEFAULTS",
    "MODEL_DEFAULTS",
    "RELEASE_NAMES",
    "RELEASE_VOCAB_SIZE",
    "Steerling",
    "SteerlingOutput",
    "diagram_sizes",
    "release_key",
    "release_names",
]
