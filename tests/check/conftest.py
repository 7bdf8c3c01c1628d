"""Fixtures for %gpucheck's tests: the NVML double installed as ``pynvml``, and this machine's
environment report as a CUDA torch would give it (for the readings, which need NVML only)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from nvml_double import NvmlDouble

from gpumagic.environment.check import _last


@pytest.fixture(autouse=True)
def no_last_check() -> Iterator[None]:
    """Each test starts without a check of this session (what %gpuenv --save would add)."""
    saved = list(_last)
    _last.clear()
    yield
    _last[:] = saved


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Callable[..., NvmlDouble]:
    """install(cards) -> NvmlDouble: ``import pynvml`` answers from the recorded states."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def install(cards: list[dict[str, Any]]) -> NvmlDouble:
        fake = NvmlDouble(cards)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return install


@pytest.fixture(scope="session")
def here() -> Any:
    """This machine's environment report (torch 2.13's CPU build here)."""
    from gpumagic.environment.collect import collect

    return collect()


@pytest.fixture
def with_cuda_torch(here: Any) -> Any:
    """The same report as a CUDA build of torch would give it: the readings' findings alone,
    without the CPU-only torch's (the measurements cannot run here, so checks pass
    measure=False with it)."""
    return dataclasses.replace(here, cuda_available=True, torch_build="CUDA 12.8", cuda_runtime="12.8", findings=[])
