"""Paths of the shared real traces, and a tiny trace builder for rule edge cases.

The builder writes Chrome-trace JSON in Kineto's new schema; it is a test double for
situations the shared traces do not contain (an optimizer loop on a GPU), and lives in
tests only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

# ../shared/traces relative to the repository root (tests/profile/x.py -> parents[2])
TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"

ALL_TRACES = [
    "a100_alexnet_syncs.json.gz",
    "a100_cupti_counters.json.gz",
    "a100_training_control.json.gz",
    "a100_triton_kernel.json.gz",
    "cpu_only.json.gz",
    "mi250_rocm_minitoy.json.gz",
    "resnet50_v100_num_workers_0.json.gz",
    "resnet50_v100_num_workers_4.json.gz",
    "v100_training_5steps.json.gz",
    "v100_training_test.json.gz",
    "two_ranks/rank-0.json.gz",
    "two_ranks/rank-1.json.gz",
]


def trace_path(name: str) -> Path:
    path = TRACES / name
    if not path.exists():
        pytest.skip(
            f"real trace {path} is not available (expected ../shared/traces next to the repo)"
        )
    return path


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

    def op(self, name: str, ts: float, dur: float, cat: str = "cpu_op", **args: Any) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 1,
                "tid": 1,
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
                "tid": 1,
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
