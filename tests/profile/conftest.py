"""Fixtures for the trace-analysis tests: the shared real traces, each loaded once."""

from __future__ import annotations

import pytest
from profile_helpers import trace_path

_cache: dict[tuple[str, bool], object] = {}


@pytest.fixture(scope="session")
def load():
    """load(name) -> ProfileResult for a shared trace, loaded once per test session;
    ``keep_startup=True`` keeps an unmarked trace's start-up phase in its step, as the
    TensorBoard plugin and Holistic Trace Analysis count it."""
    from gpumagic.profile.load import load_trace

    def _load(name: str, keep_startup: bool = False):
        key = (name, keep_startup)
        if key not in _cache:
            _cache[key] = load_trace(trace_path(name), keep_startup=keep_startup)
        return _cache[key]

    return _load
