"""Shared test configuration: the hypothesis profile every property test runs under, a fixture
pinning torch to one intra-op thread for modules of tiny tensors, and what running in parallel
(pytest-xdist, `make test`) needs: each worker's share of the cores."""

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


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs `-n auto`) each worker is one process of several on
    these cores: its torch gets its share of them as intra-op threads (one each on two cores),
    never the whole machine per worker."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if os.environ.get("PYTEST_XDIST_WORKER") and workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
