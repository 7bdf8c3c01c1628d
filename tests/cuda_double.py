"""A stand-in for the ``torch.cuda`` functions gpumagic calls, for CPU tests of the CUDA paths.

It follows torch 2.13's Python layer where it matters for the tests: the functions that run
``torch.cuda._lazy_init()`` (``current_device``, ``get_device_name``,
``get_device_properties``, ``synchronize``, ``mem_get_info``) fail the test when called
before CUDA is "initialised" (gpumagic must never initialise it), and ``memory_stats_as_nested_dict`` answers ``{}``
until then, as torch's does. Values are whatever a test sets. Tests only.
"""

from __future__ import annotations

import time
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
import torch

GIB = 2**30


class FakeCuda:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, devices: int = 1) -> None:
        self.devices = devices
        self.initialized = False
        self.allocated = 0  # allocated_bytes.all.current
        self.peak = 0
        self.reserved = 0
        self.sync_seconds = 0.0  # what each synchronize() waits
        self.sync_error: BaseException | None = None
        self.contexts: set[int] = set()  # devices with a primary context
        self.calls: Counter[str] = Counter()
        self.init_attempts: list[str] = []
        cuda = torch.cuda
        for name in (
            "is_available",
            "device_count",
            "is_initialized",
            "current_device",
            "get_device_name",
            "get_device_properties",
            "memory_stats_as_nested_dict",
            "memory_stats",
            "reset_peak_memory_stats",
            "synchronize",
            "mem_get_info",
        ):
            monkeypatch.setattr(cuda, name, getattr(self, name))
        monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", self.has_primary_context, raising=False)

    # -- lazily initialising in torch: refused before init ----------------------------------
    def _init_needed(self, name: str) -> None:
        self.calls[name] += 1
        if not self.initialized:
            self.init_attempts.append(name)
            raise AssertionError(f"torch.cuda.{name}() would initialise CUDA here")

    def current_device(self) -> int:
        self._init_needed("current_device")
        return 0

    def get_device_name(self, index: int = 0) -> str:
        self._init_needed("get_device_name")
        return "Fake H200"

    def get_device_properties(self, index: int = 0) -> Any:
        self._init_needed("get_device_properties")
        return SimpleNamespace(
            name="Fake H200", total_memory=140 * GIB, major=9, minor=0,
            multi_processor_count=132, uuid="8d2e3f4a-0000-0000-0000-000000000000",
        )

    def synchronize(self, device: Any = None) -> None:
        self._init_needed("synchronize")
        if self.sync_error is not None:
            raise self.sync_error
        if self.sync_seconds:
            time.sleep(self.sync_seconds)

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        self._init_needed("mem_get_info")
        return 2 * GIB, 140 * GIB

    # -- never initialising in torch ----------------------------------------------------------
    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.devices

    def is_initialized(self) -> bool:
        return self.initialized

    def has_primary_context(self, index: int) -> bool:
        self.calls["_cuda_hasPrimaryContext"] += 1
        return index in self.contexts

    def memory_stats_as_nested_dict(self, device: Any = None) -> dict[str, Any]:
        self.calls["memory_stats_as_nested_dict"] += 1
        if not self.initialized:
            return {}
        stat = {"current": self.allocated, "peak": max(self.peak, self.allocated)}
        return {
            "allocated_bytes": {"all": stat, "large_pool": stat, "small_pool": stat},
            "reserved_bytes": {"all": {"current": self.reserved, "peak": self.reserved}},
            "num_alloc_retries": 0,
        }

    def memory_stats(self, device: Any = None) -> dict[str, Any]:
        """The flattened dictionary (what an OOM report reads once; never per statement)."""
        self.calls["memory_stats"] += 1
        out: dict[str, Any] = {}

        def flatten(prefix: str, value: Any) -> None:
            if isinstance(value, dict):
                for k, v in value.items():
                    flatten(f"{prefix}.{k}" if prefix else str(k), v)
            else:
                out[prefix] = value

        flatten("", self.memory_stats_as_nested_dict(device))
        return out

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self.calls["reset_peak_memory_stats"] += 1
        self.peak = self.allocated

    # -- what a test's cell does --------------------------------------------------------------
    def allocate(self, nbytes: int) -> None:
        """A cell "allocating" on the fake device (initialises CUDA, as a real tensor would)."""
        self.initialized = True
        self.contexts.add(0)
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)
        self.reserved = max(self.reserved, self.allocated)
