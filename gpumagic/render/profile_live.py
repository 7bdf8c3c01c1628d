"""The live line while a ``%%gpuprofile`` cell runs, drawn from the run's status
(:meth:`gpumagic.profile.record.run.ProfileRun.status`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumagic.render.html import escape, wrap

if TYPE_CHECKING:
    from gpumagic.profile.record.run import ProfileStatus


def profile_live_html(status: ProfileStatus) -> str:
    steps = (
        f"{status.steps} steps marked" if status.steps else "no gpumagic.step() marks yet"
    )
    return wrap(
        "profile-live",
        f"<div><b>%%gpuprofile</b> profiling ({escape(status.devices)}) · "
        f"{status.elapsed_s:.0f} s elapsed · {steps}</div>",
    )
