"""Shared test configuration: the hypothesis profile every property test runs under, and a
fixture pinning torch to one intra-op thread for modules of tiny tensors."""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# CI: reproducible (derandomize) and never flaky on a slow machine (no deadline).
settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: a second intra-op thread only adds contention (far slower on a busy machine).
    Use it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
