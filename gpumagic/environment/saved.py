"""The environment report as a file: ``%gpuenv --save FILE.json`` writes it, ``--diff`` and
``gpumagic.env_diff`` read it back (issue 29).

One JSON object: ``format`` ("gpumagic-env") and ``version`` (:data:`VERSION`) say what it
is; ``saved_at`` (seconds since the epoch), ``gpumagic`` (the version that wrote it), ``env``
(:meth:`EnvReport.to_dict`) and ``check`` (:meth:`GpuCheck.to_dict`, or null when no check
was run). The file is written to a temporary name beside it and renamed, so a failed write
leaves the old file whole. Reading a file that is not one, a truncated one, or one of another
format version raises :class:`SavedEnvError`, whose message is one line naming the file.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpumagic.environment.check.result import GpuCheck
    from gpumagic.environment.report import EnvReport

FORMAT = "gpumagic-env"
VERSION = 1
# What every saved env section holds (the keys the diff reads).
_ENV_KEYS = ("torch_version", "torch_build", "gpus", "driver", "flags", "env_vars", "cpu", "packages")


class SavedEnvError(ValueError):
    """A file that cannot be read as a saved environment; ``str()`` is one line naming it."""


@dataclass(frozen=True)
class SavedEnv:
    """One machine's environment as data: from a file (``path``) or read now (``path`` None).
    ``env`` is the report's ``to_dict()``, ``check`` the check's (None without one)."""

    env: dict[str, Any]
    check: dict[str, Any] | None = None
    path: str | None = None
    saved_at: float | None = None
    gpumagic: str | None = None

    @property
    def label(self) -> str:
        return Path(self.path).name if self.path else "this machine"


def as_data(report: EnvReport, check: GpuCheck | None = None) -> dict[str, Any]:
    """What the file holds (module docstring)."""
    from gpumagic._version import __version__

    return {
        "format": FORMAT,
        "version": VERSION,
        "saved_at": time.time(),
        "gpumagic": __version__,
        "env": report.to_dict(),
        "check": check.to_dict() if check is not None else None,
    }


def save(path: str | os.PathLike[str], report: EnvReport, check: GpuCheck | None = None) -> Path:
    """Write ``report`` (and ``check``) to ``path`` as JSON; the path written."""
    target = Path(path)
    text = json.dumps(as_data(report, check), indent=1, default=str)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or Path("."))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load(path: str | os.PathLike[str]) -> SavedEnv:
    """Read a saved environment; :class:`SavedEnvError` (one line, naming the file) for a
    file that is missing, not JSON, truncated, not a report, or of another format version."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise SavedEnvError(f"{name}: cannot read it ({why})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        stripped = text.rstrip()
        cut = ", cut short" if stripped.startswith("{") and not stripped.endswith("}") else ""
        raise SavedEnvError(
            f"{name}: not valid JSON{cut} ({exc.msg}, line {exc.lineno} column {exc.colno})"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SavedEnvError(
            f'{name}: not a gpumagic environment report (no "format": "{FORMAT}"; '
            "%gpuenv --save FILE.json writes one)"
        )
    version = data.get("version")
    if version != VERSION:
        who = f", written by gpumagic {data['gpumagic']}" if isinstance(data.get("gpumagic"), str) else ""
        raise SavedEnvError(
            f"{name}: a gpumagic environment report of format version {version!r}{who}; this "
            f"gpumagic reads version {VERSION}"
        )
    env, check = data.get("env"), data.get("check")
    if not isinstance(env, dict) or any(k not in env for k in _ENV_KEYS):
        raise SavedEnvError(f"{name}: a gpumagic environment report without its environment (cut short or edited?)")
    if check is not None and not isinstance(check, dict):
        raise SavedEnvError(f"{name}: its check is not an object (cut short or edited?)")
    saved_at = data.get("saved_at")
    return SavedEnv(
        env, check, name, float(saved_at) if isinstance(saved_at, (int, float)) else None,
        data.get("gpumagic") if isinstance(data.get("gpumagic"), str) else None,
    )  # fmt: skip


def current(report: EnvReport, check: GpuCheck | None = None) -> SavedEnv:
    """This machine now, as a saved environment is (for ``%gpuenv --diff``)."""
    from gpumagic._version import __version__

    return SavedEnv(
        report.to_dict(), check.to_dict() if check is not None else None, None, time.time(), __version__
    )
