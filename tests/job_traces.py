"""A many-rank job written from the two real rank traces, for the rank tests and benchmark.

``write_job(out, ranks=64, straggler=17)`` writes ``rank-N.json.gz`` for N in 0..ranks-1:
rank N is a copy of the real ``two_ranks/rank-(N % 2)`` with every timestamp shifted by
its own offset and ``distributedInfo`` saying rank N of ``ranks``. The straggler's compute
kernels (every GPU kernel but NCCL's) last ``stretch`` times longer, and every later event
on the same GPU stream starts that much later, as a slower GPU would run the same work.
Generated at run time from the shared traces (never committed), in tests and benchmarks only.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from trace_data import require_trace

_NCCL = ("nccl",)  # ncclKernel_*, ncclDevKernel_*, ncclSymDevKernel_*


def _is_compute_kernel(e: dict[str, Any]) -> bool:
    return e.get("cat") == "kernel" and not str(e.get("name", "")).lower().startswith(_NCCL)


def _stretched(events: list[dict[str, Any]], stretch: float) -> None:
    """Lengthen the compute kernels in place and push later events on each stream back."""
    streams: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            streams.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for stream in streams.values():
        stream.sort(key=lambda e: e["ts"])
        delay = 0.0
        for e in stream:
            e["ts"] += delay
            if _is_compute_kernel(e):
                extra = e["dur"] * (stretch - 1.0)
                e["dur"] += extra
                delay += extra


def _shifted(doc: dict[str, Any], shift_us: float) -> dict[str, Any]:
    out = {k: v for k, v in doc.items() if k != "traceEvents"}
    events = []
    for e in doc["traceEvents"]:
        e = dict(e)
        if "ts" in e:
            e["ts"] = e["ts"] + shift_us
        events.append(e)
    out["traceEvents"] = events
    return out


def write_job(
    out: Path, ranks: int = 64, straggler: int | None = 17, stretch: float = 1.6
) -> list[Path]:
    """Write the job's rank files into ``out`` (created); returns their paths."""
    sources = []
    for name in ("two_ranks/rank-0.json.gz", "two_ranks/rank-1.json.gz"):
        sources.append(json.loads(gzip.decompress(require_trace(name).read_bytes())))
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(ranks):
        doc = _shifted(sources[rank % 2], shift_us=rank * 1234.5)
        doc["distributedInfo"] = {
            **doc.get("distributedInfo", {}),
            "rank": rank,
            "world_size": ranks,
        }
        if rank == straggler:
            _stretched(doc["traceEvents"], stretch)
        path = out / f"rank-{rank}.json.gz"
        path.write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=6))
        paths.append(path)
    return paths
