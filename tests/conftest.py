"""Shared test configuration: the hypothesis profile every property test runs under."""

import os

from hypothesis import HealthCheck, settings

# CI: reproducible (derandomize) and never flaky on a slow machine (no deadline).
settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
