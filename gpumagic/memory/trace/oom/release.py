"""The release of a failed call's frames after running out of memory."""

from __future__ import annotations

from gpumagic.tracebacks import exception_chain

__all__ = ["release_frames"]


def release_frames(error: BaseException, cell_filename: str) -> None:
    """Drop the locals of the failed cell's frames so the tensors they hold are freed.

    An OOM's traceback keeps every frame of the failing call alive (and IPython keeps the
    traceback in ``sys.last_traceback``), and with them the activations the user was
    trying to free. Only frames from the cell's own code down are cleared (the magic's
    frames keep what the traceback display needs), and only for OOM errors: for other
    errors the locals stay for ``%debug``.
    """
    for exc in exception_chain(error):
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != cell_filename:
            tb = tb.tb_next
        while tb is not None:
            frame = tb.tb_frame
            try:
                frame.clear()
            except RuntimeError:  # still executing: not one of the failed call's frames
                pass
            else:
                # A locals snapshot (frame.f_locals, read by frame_tensors or a debugger)
                # outlives clear() on Python < 3.13; reading it again re-syncs it with the
                # now empty locals, which drops its references.
                _ = frame.f_locals
            tb = tb.tb_next
