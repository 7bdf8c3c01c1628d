"""Helpers shared by the watcher tests (a module, so tests can import it by name)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpumagic-watch" and t.is_alive()]


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def nvml_and_cuda() -> bool:
    """A CUDA GPU torch can use and NVML that lists one: what the real-GPU watcher tests need."""
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount()) > 0
    except Exception:
        return False
