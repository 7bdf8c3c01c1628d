"""A folder of per-rank traces: which of its files are traces, and what is left out.

``torch.profiler.tensorboard_trace_handler`` writes ``<worker>.<timestamp>.pt.trace.json``
(``.gz`` when asked); plain ``export_chrome_trace`` files are ``*.json`` or ``*.json.gz``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

__all__ = ["trace_files", "unreadable_entries"]

_TRACE_SUFFIXES = (".json", ".json.gz")


def trace_files(directory: Path) -> list[Path]:
    """The trace files of a directory of per-rank traces, in a stable order."""
    files = [p for p in directory.iterdir() if p.is_file() and p.name.endswith(_TRACE_SUFFIXES)]
    return sorted(files, key=lambda p: p.name)


def unreadable_entries(directory: Path) -> list[str]:
    """Why each entry named like a trace that :func:`trace_files` leaves out is no file: a
    link whose target is gone, a link loop, a folder. A rank left out without a word loads
    as a smaller job (issue 25)."""
    out = []
    for p in sorted(directory.iterdir(), key=lambda p: p.name):
        if not p.name.endswith(_TRACE_SUFFIXES) or p.is_file():
            continue
        if not p.is_symlink():
            why = "is a folder" if p.is_dir() else "is not a file"
        else:
            try:
                p.stat()
                why = f"is a link to {os.readlink(p)}, which is not a file"
            except OSError as e:
                why = (
                    "is a link that loops back on itself"
                    if e.errno == errno.ELOOP
                    else f"is a link to {os.readlink(p)}, which does not exist"
                )
        out.append(f"{p.name} {why}: it was left out")
    return out
