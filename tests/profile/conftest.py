"""Fixtures for the trace-analysis tests: the shared real traces, each loaded once."""

from __future__ import annotations

import pytest
from profile_helpers import trace_path

_cache: dict[str, object] = {}


@pytest.fixture(scope="session")
def load():
    """load(name) -> ProfileResult for a shared trace, loaded once per test session."""
    from gpumagic.profile.load import load_trace

    def _load(name: str):
        if name not in _cache:
            _cache[name] = load_trace(trace_path(name))
        return _cache[name]

    return _load
