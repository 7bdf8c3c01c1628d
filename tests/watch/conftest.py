"""Fixtures for the watcher tests: a real IPython shell, the NVML double, no leaked threads."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from watch_helpers import watch_threads
from watch_nvml_double import FakeNvml

from gpumagic.monitor import stop_current


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    """Every test ends with no sampler running, whatever it did."""
    yield
    stop_current()
    assert watch_threads() == []


@pytest.fixture
def wshell(shell: Any) -> Any:
    """The suite's session shell (IPython's global test shell, extension loaded). The watcher
    registers its own cell events, so these tests need nothing from the extension itself."""
    return shell


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeNvml]:
    """install(gpus) -> FakeNvml: makes `import pynvml` return the double for this test."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def install(gpus: list[dict[str, Any]], **kw: Any) -> FakeNvml:
        fake = FakeNvml(gpus, **kw)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return install
