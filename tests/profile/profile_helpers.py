"""Paths of the real traces, and a tiny trace builder for rule edge cases.

The builder writes Chrome-trace JSON in Kineto's new schema; it is a test double for
situations the shared traces do not contain (an optimizer loop on a GPU), and lives in
tests only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trace_data import REGISTRY, require_trace

ALL_TRACES = list(REGISTRY)


def trace_path(name: str) -> Path:
    """A real trace (or folder of them): ../shared/traces or the cache, fetched on first use;
    the test skips, saying why, when it cannot be had (see tests/trace_data.py)."""
    return require_trace(name)


class TraceBuilder:
    """Append host ops, runtime launches and kernels; write a new-schema trace."""

    def __init__(self, gpu: str = "NVIDIA A100-SXM4-40GB", major: int = 8, sms: int = 108) -> None:
        self.events: list[dict[str, Any]] = []
        self.corr = 1
        self.props = [
            {
                "id": 0,
                "name": gpu,
                "totalGlobalMem": 42_000_000_000,
                "computeMajor": major,
                "computeMinor": 0,
                "numSms": sms,
            }
        ]

    def op(
        self, name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1, **args: Any
    ) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 1,
                "tid": tid,
                "ts": ts,
                "dur": dur,
                "args": {"External id": len(self.events), **args},
            }
        )

    def launch(
        self,
        kernel: str,
        ts: float,
        gpu_ts: float,
        gpu_dur: float,
        launch_dur: float = 5.0,
        cat: str = "kernel",
        tid: int = 1,
        **kargs: Any,
    ) -> None:
        c = self.corr
        self.corr += 1
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": tid,
                "ts": ts,
                "dur": launch_dur,
                "args": {"correlation": c},
            }
        )
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": kernel,
                "pid": 0,
                "tid": 7,
                "ts": gpu_ts,
                "dur": gpu_dur,
                "args": {"correlation": c, "stream": 7, "device": 0, **kargs},
            }
        )

    def write(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {"schemaVersion": 1, "deviceProperties": self.props, "traceEvents": self.events}
            )
        )
        return path
