"""A trace file's JSON text (a folder's trace files: :mod:`.folders`).

Kept apart from :mod:`.decode` and importing nothing heavy, so that ``gpumagic analyze``
can start reading (and inflating) the trace before it imports numpy, pandas and the
analysis: :func:`read_ahead` starts a thread that reads the file, and the next
:func:`read_trace_bytes` of the same path takes its bytes. zlib inflates without the GIL,
so on a second CPU the inflation runs while the imports do; on one CPU nothing is lost.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpumagic.profile.trace.errors import TraceError

_isal_decompressobj: Callable[[int], Any] | None
try:  # ISA-L's inflate: a dependency where it has wheels (pyproject.toml), zlib elsewhere
    from isal.isal_zlib import decompressobj as _isal_decompressobj
except ImportError:  # pragma: no cover - a platform without isal's wheels
    _isal_decompressobj = None

_GZIP_MAGIC = b"\x1f\x8b"

def read_trace_bytes(path: Path) -> bytes:
    """The JSON text of a ``.json`` or ``.json.gz`` file (gzip detected by its magic bytes)."""
    ahead = _claim(path)
    return ahead.result() if ahead is not None else _read(path)


def _read(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, "is a directory, not a trace file") from None
    except OSError as e:
        raise TraceError(path, f"cannot be read ({e.strerror or e})") from None
    if not data:
        raise TraceError(path, "the file is empty")
    if data[:2] != _GZIP_MAGIC:
        return data
    out = _inflate_fast(data)
    if out is None:
        out = _inflate(path, data)
    if not out or out.isspace():  # isspace stops at the first other byte: no copy
        raise TraceError(path, "the file is empty (after decompression)")
    return out


def _inflate_fast(data: bytes) -> bytes | None:
    """The gzip members of ``data`` inflated by ISA-L (``isal``, where installed: 1.7x
    zlib's speed on a 35 MB trace, the same bytes), or None for :func:`_inflate` to do it
    and say what is wrong: ISA-L reads a header it does not know as a stream cut short,
    and its messages are not zlib's."""
    if _isal_decompressobj is None:
        return None
    parts = []
    rest = data
    try:
        while rest[:2] == _GZIP_MAGIC:
            d = _isal_decompressobj(47)
            parts.append(d.decompress(rest))
            if not d.eof:
                return None
            rest = d.unused_data
    except Exception:  # isal's own error class: zlib's read decides what to say
        return None
    return b"".join(parts) if len(parts) > 1 else parts[0]


def _inflate(path: Path, data: bytes) -> bytes:
    # wbits=47: accept gzip or zlib headers; a decompressobj tells a truncated stream
    # (no end-of-stream marker) apart from a complete one, which zlib.decompress does not.
    parts = []
    rest = data
    try:
        while rest[:2] == _GZIP_MAGIC:  # concatenated members are valid gzip
            d = zlib.decompressobj(47)
            parts.append(d.decompress(rest))
            if not d.eof:
                raise TraceError(path, "the gzip stream is truncated (the file was cut off)")
            rest = d.unused_data
    except zlib.error as e:
        raise TraceError(path, f"is not a valid gzip file ({e})") from None
    return b"".join(parts) if len(parts) > 1 else parts[0]


class _ReadAhead:
    """One file being read by a thread of its own; :meth:`result` waits for its bytes, or
    raises what reading it raised (a :class:`TraceError` says why, as a direct read would)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._data: bytes | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="gpumagic-read-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._data = _read(self._path)
        except BaseException as e:  # handed to the reader, in its thread
            self._error = e

    def result(self) -> bytes:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._data is not None
        return self._data


_AHEAD: dict[str, _ReadAhead] = {}
_AHEAD_LOCK = threading.Lock()


def _key(path: Path) -> str:
    return os.path.abspath(Path(path).expanduser())


def read_ahead(path: str | Path) -> None:
    """Start reading the trace file ``path`` in a thread; the next :func:`read_trace_bytes`
    of that path takes the bytes (or the error) instead of reading the file itself. Only
    for a caller that reads the file next, moments later (``gpumagic analyze``): the bytes
    are held until then."""
    p = Path(path).expanduser()
    with _AHEAD_LOCK:
        if _key(p) not in _AHEAD:
            _AHEAD[_key(p)] = _ReadAhead(p)


def _claim(path: Path) -> _ReadAhead | None:
    if not _AHEAD:  # the usual case: nothing read ahead, no lock taken
        return None
    with _AHEAD_LOCK:
        return _AHEAD.pop(_key(path), None)
