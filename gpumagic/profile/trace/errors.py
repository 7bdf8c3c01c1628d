"""The one exception the trace analysis raises for input it cannot use."""

from __future__ import annotations


class TraceError(ValueError):
    """A file or directory is not a usable profiler trace.

    The message always starts with the path and says why (missing, empty, truncated,
    not JSON, JSON but not a Chrome trace), so a user never sees a ``KeyError`` from
    deep inside the analysis.
    """

    def __init__(self, path: object, why: str) -> None:
        self.path = str(path)
        self.why = why
        super().__init__(f"{self.path}: {why}")
