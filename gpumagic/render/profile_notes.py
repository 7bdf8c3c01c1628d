"""What ``%%gpuprofile`` shows when a run ends: the report with the core's notes on top."""

from __future__ import annotations

from typing import Any

from gpumagic.render.html import Note, Noted


def noted(done: Any, returned: bool) -> Any:
    """The report with the core's notes (:meth:`~gpumagic.profile.record.finish.Finished.notes`)
    on top; the notes alone where there is no report, or where the report is the magic's
    value (``returned``: -o)."""
    notes = "\n".join(done.notes())
    if done.reported and not returned:
        return Noted(done.result, notes, "profile-note")
    return Note(notes, "profile-note", box=True) if notes else None
