"""The event phases (``ph``) of the Chrome trace format, for decoders that read a few of
them and skip the rest without materialising them."""

from __future__ import annotations

import msgspec

__all__ = ["PHASES", "skipped_phases"]

# complete, instant (and its deprecated spelling), metadata, begin/end, counter, async,
# sample, object, mark, clock sync, context and flow events
PHASES = "XiIMBECbnePONDVvRc()stf"


def skipped_phases(keep: str, prefix: str) -> tuple[type, ...]:
    """An empty struct tagged by each phase not in ``keep``: a decoder's union lists these
    beside its own structs, so every other event decodes to nothing."""
    return tuple(
        msgspec.defstruct(f"{prefix}_{ord(ph)}", [], tag_field="ph", tag=ph, gc=False)
        for ph in PHASES
        if ph not in keep
    )
