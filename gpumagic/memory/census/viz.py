"""A traced cell's tensors as a snapshot PyTorch's memory visualiser opens
(https://pytorch.org/memory_viz: drop the ``.pickle`` file on it).

The format is the one ``torch.cuda.memory._snapshot()`` writes and
``torch.cuda._memory_viz`` reads: ``segments`` (the blocks alive when recording started)
and ``device_traces`` (``alloc``, ``free_requested``, ``free_completed`` events in order),
each event carrying a ``category`` and ``frames``. torch builds the same from its profiler
(``torch.cuda._memory_viz._profile_to_snapshot``); here the census's own events are used,
so it works on the CPU. Addresses are the census's, laid out one after another (the CPU's
real addresses say nothing the visualiser can use); each allocation's frames name its
statement and the module that made it.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpumagic.cell import Statement
from gpumagic.memory.census.categories import NAMES, TEMPORARIES
from gpumagic.memory.census.ledger import EARLIER, PENDING, EventLog, Record

__all__ = ["memory_viz_snapshot", "write_memory_viz"]


def _category(rec: Record) -> str:
    return NAMES[rec.cat if rec.cat < PENDING else TEMPORARIES]


def memory_viz_snapshot(
    events: EventLog,
    statements: Sequence[Statement],
    module_names: Mapping[int, str],
    filename: str = "cell",
) -> dict[str, Any]:
    """The snapshot dictionary of one traced cell (see the module docstring)."""
    addresses: dict[int, int] = {}  # id(record) -> its address
    end = 0

    def address(rec: Record) -> int:
        nonlocal end
        addr = addresses.get(id(rec))
        if addr is None:
            addr = addresses[id(rec)] = end
            end += max(rec.nbytes, 1)
        return addr

    def frames(rec: Record) -> list[dict[str, Any]]:
        module = module_names.get(rec.module, "") if rec.module else ""
        out = [{"filename": module or "(no module)", "line": 0, "name": _category(rec)}]
        if 0 <= rec.statement < len(statements):
            s = statements[rec.statement]
            out.append({"filename": filename, "line": s.line, "name": s.source.splitlines()[0]})
        else:
            out.append({"filename": filename, "line": 0, "name": "(alive before the cell)"})
        return out

    # MemoryViz.js appends "unknown" to the categories it found with a misspelt name
    # ("categores") and stops, unless a trace event already carries "unknown": this one does.
    trace: list[dict[str, Any]] = [
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "frames": [], "category": "unknown"}
    ]
    before: list[Record] = []
    for rec, sign in zip(events.records, events.signs):
        if sign > 0 and rec.born == EARLIER:
            before.append(rec)
            address(rec)
            continue
        entry = {
            "addr": address(rec),
            "size": rec.nbytes,
            "stream": 0,
            "frames": frames(rec),
            "category": _category(rec),
        }
        if sign > 0:
            trace.append({"action": "alloc", **entry})
        else:
            trace.append({"action": "free_requested", **entry})
            trace.append({"action": "free_completed", **entry})
    return {"segments": [_segment(before, address, frames, end)], "device_traces": [trace]}


def _segment(before: list[Record], address: Any, frames: Any, end: int) -> dict[str, Any]:
    """One segment spanning every address handed out: the storages alive at the start as
    allocated blocks (they come first), the rest free."""
    blocks = [
        {
            "address": address(rec),
            "size": max(rec.nbytes, 1),
            "requested_size": max(rec.nbytes, 1),
            "state": "active_allocated",
            "frames": frames(rec),
        }
        for rec in before
    ]
    used = sum(b["size"] for b in blocks)
    total = max(end, 1)
    if total > used:
        blocks.append({"address": used, "size": total - used, "requested_size": 0, "state": "inactive"})
    return {
        "device": 0,
        "address": 0,
        "total_size": total,
        "allocated_size": used,
        "active_size": used,
        "requested_size": used,
        "stream": 0,
        "segment_type": "large",
        "blocks": blocks,
        "frames": [],
    }


def write_memory_viz(path: str | Path, snapshot: dict[str, Any]) -> Path:
    """Write ``snapshot``: a pickle for https://pytorch.org/memory_viz, or, for a path ending
    in ``.html``, torch's own page around it (``torch.cuda._memory_viz.trace_plot``, which
    loads the visualiser's script from the web when opened)."""
    out = Path(path)
    if out.suffix.lower() in (".html", ".htm"):
        from torch.cuda import _memory_viz

        out.write_text(_memory_viz.trace_plot(snapshot), encoding="utf-8")
    else:
        with out.open("wb") as f:
            pickle.dump(snapshot, f)
    return out
