"""``%gpuenv --freeze FILE``: every installed distribution, pinned, as requirements.txt or
a conda environment.yml, with the Python and torch build it was taken from in the header.

Unlike ``pip freeze``, the torch pin comes with the PyTorch wheel index it needs
(``torch==2.3.1+cu121`` exists only on download.pytorch.org), and packages installed from a
local directory (editable checkouts) become comments: a pin for a version that no index
has would make the whole file fail to install elsewhere.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpumagic.environment.checks import cuda_tag
from gpumagic.environment.docker import Toolchain
from gpumagic.render.html import Rendered

PYTORCH_INDEX = "https://download.pytorch.org/whl"
FORMATS = {".txt": "requirements", ".yml": "environment", ".yaml": "environment"}
DOCKERFILE = "dockerfile"  # a file named Dockerfile or *.Dockerfile (issue 12)


class FreezeError(Exception):
    """The file cannot be written (bad extension, unwritable path); the message names the path."""


@dataclass(frozen=True)
class Installed:
    """One installed distribution; ``direct_url`` is its PEP 610 ``direct_url.json``, if any."""

    name: str
    version: str
    direct_url: dict[str, object] | None = None


class Build(Toolchain, Protocol):
    """What the header reads from an environment report (``EnvReport`` has all of it).

    A protocol rather than ``EnvReport`` itself: the report's ``freeze()`` calls this module,
    and this module naming the report back would be an import circle (issue 8)."""

    @property
    def cuda_runtime(self) -> str | None: ...
    @property
    def hip_runtime(self) -> str | None: ...
    @property
    def packages(self) -> dict[str, str]: ...
    @property
    def cudnn(self) -> str | None: ...


@dataclass(frozen=True)
class Header:
    python: str
    platform: str
    torch_version: str | None
    torch_build: str
    cuda: str | None
    hip: str | None
    when: str
    by: str
    cudnn: str | None = None


@dataclass(repr=False)
class FreezeResult(Rendered):
    """What ``freeze`` wrote: ``pinned`` requirement lines, ``commented`` local installs."""

    path: str
    format: str
    pinned: int
    commented: list[str] = field(default_factory=list)
    index_url: str | None = None
    # A Dockerfile (format "dockerfile"): its base image and the requirements written beside it.
    base_image: str | None = None
    base_image_why: list[str] = field(default_factory=list)
    requirements_path: str | None = None

    def _text(self) -> str:
        if self.format == DOCKERFILE:
            return self._dockerfile_text()
        kind = "requirements.txt" if self.format == "requirements" else "conda environment.yml"
        parts = [f"Wrote {self.pinned} pinned packages to {self.path} ({kind})."]
        if self.index_url:
            parts.append(f"torch comes from --extra-index-url {self.index_url}.")
        if self.commented:
            parts.append(
                "Installed from local directories, written as comments: "
                + ", ".join(self.commented)
                + "."
            )
        return " ".join(parts)

    def _dockerfile_text(self) -> str:
        parts = [
            f"Wrote {self.path} (FROM {self.base_image}; CMD starts JupyterLab on port 8888) and "
            f"{self.pinned} pinned packages to {self.requirements_path} beside it."
        ]
        if self.base_image_why:
            parts.append(self.base_image_why[0][:1].upper() + self.base_image_why[0][1:] + ".")
        if self.index_url:
            parts.append(f"torch comes from --index-url {self.index_url}.")
        if self.commented:
            parts.append("Not in the image (local installs): " + ", ".join(self.commented) + ".")
        folder = os.path.dirname(self.path)
        parts.append(f"Build: docker build -f {os.path.basename(self.path)} {folder}")
        return " ".join(parts)

    def _html(self) -> str:
        from gpumagic.render.html import escape, wrap

        return wrap("freeze", f'<div class="gm-note">{escape(self._text())}</div>', style=False)


def freeze_format(path: str | os.PathLike[str]) -> str:
    """``requirements``, ``environment`` or ``dockerfile`` from the file's name; FreezeError
    otherwise."""
    name = Path(path).name
    if name.lower() == "dockerfile" or name.lower().endswith(".dockerfile"):
        return DOCKERFILE
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise FreezeError(
            f"{os.fspath(path)!r}: the name chooses the format; use .txt (requirements.txt), "
            ".yml/.yaml (conda environment.yml) or Dockerfile / NAME.Dockerfile (an image)"
        )
    return FORMATS[suffix]


def freeze(path: str | os.PathLike[str], report: Build) -> FreezeResult:
    """Write the pinned environment to ``path``; ``report`` (an ``EnvReport``) supplies the
    Python and torch build for the header. ``gpumagic.environment.freeze(path)`` reads one."""
    fmt = freeze_format(path)
    target = Path(path).expanduser()
    header = Header(
        python=report.python,
        platform=report.platform,
        torch_version=report.torch_version,
        torch_build=report.torch_build,
        cuda=report.cuda_runtime,
        hip=report.hip_runtime,
        when=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        by=f"gpumagic {report.packages.get('gpumagic', '')}".strip(),
        cudnn=getattr(report, "cudnn", None),
    )
    installed = installed_distributions()
    if fmt == DOCKERFILE:
        return freeze_dockerfile(target, header, installed)
    if fmt == "requirements":
        text = requirements_text(installed, header)
    else:
        text = environment_text(installed, header, env_name())
    try:
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise FreezeError(f"cannot write {os.fspath(target)!r}: {exc.strerror or exc}") from exc
    lines = [pin_line(d) for d in installed]
    index, needed = torch_index(header)
    return FreezeResult(
        path=os.path.abspath(target),
        format=fmt,
        pinned=sum(1 for _, pinned in lines if pinned),
        commented=[d.name for d, (_, pinned) in zip(installed, lines) if not pinned],
        index_url=index if needed else None,
    )


# --- reading what is installed -------------------------------------------------------------


def canonical(name: str) -> str:
    """PEP 503 normalised name: ``Foo.Bar_baz -> foo-bar-baz``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_distributions() -> list[Installed]:
    """Every distribution importlib.metadata finds, once each, sorted by normalised name.

    A name found twice (a source tree's ``*.egg-info`` on ``sys.path`` beside the installed
    copy) keeps the one an installer wrote (it has an ``INSTALLER`` file), else the first.
    """
    chosen: dict[str, tuple[importlib.metadata.Distribution, bool]] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata is not None else None
        if not name or not dist.version:
            continue  # broken metadata left behind by an interrupted install
        key = canonical(name)
        by_installer = dist.read_text("INSTALLER") is not None
        if key not in chosen or (by_installer and not chosen[key][1]):
            chosen[key] = (dist, by_installer)
    out = []
    for key in sorted(chosen):
        dist = chosen[key][0]
        out.append(Installed(dist.metadata["Name"], dist.version, _direct_url(dist)))
    return out


def _direct_url(dist: importlib.metadata.Distribution) -> dict[str, object] | None:
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


# --- writing -------------------------------------------------------------------------------


def pin_line(dist: Installed) -> tuple[str, bool]:
    """The requirement line for one distribution and whether it is a real pin (else a comment).

    PEP 610 tells how it was installed: from an index (no direct_url) -> ``name==version``;
    from a VCS -> ``name @ git+URL@commit``; from an archive URL -> ``name @ URL``, except a
    local wheel/sdist file, whose version is pinned as if from an index; from a local
    directory (editable or not) -> a comment, since no index has that version.
    """
    pin = f"{dist.name}=={dist.version}"
    info = dist.direct_url
    if not info:
        return pin, True
    url = str(info.get("url", ""))
    vcs = info.get("vcs_info")
    if isinstance(vcs, dict):
        commit = vcs.get("commit_id") or vcs.get("requested_revision")
        ref = f"@{commit}" if commit else ""
        return f"{dist.name} @ {vcs.get('vcs', 'git')}+{url}{ref}", True
    if "archive_info" in info:
        if url.startswith("file:"):
            return f"{pin}  # installed from {_one_line(url)}", True
        return f"{dist.name} @ {url}", True
    dir_info = info.get("dir_info")
    editable = isinstance(dir_info, dict) and bool(dir_info.get("editable"))
    where = _one_line(url.removeprefix("file://"))
    how = f"pip install -e {where}" if editable else f"pip install {where}"
    kind = "editable install" if editable else "installed"
    return f"# {pin}: {kind} from {where}, not on an index; reinstall with: {how}", False


def torch_index(header: Header) -> tuple[str | None, bool]:
    """The PyTorch wheel index of this torch build, and whether the pin needs it.

    A local version label (``+cpu``, ``+cu121``, ``+rocm6.2``) names the index and exists only
    there, so it is needed; without one, torch came from PyPI and the CUDA index of the same
    build (from ``torch.version.cuda``) is only a hint.
    """
    version = header.torch_version
    if version is None:
        return None, False
    if "+" in version:
        label = version.split("+", 1)[1]
        if label.startswith("cpu"):
            return f"{PYTORCH_INDEX}/cpu", True
        return f"{PYTORCH_INDEX}/{label}", True
    if header.hip:
        m = re.match(r"(\d+)\.(\d+)", header.hip)
        return (f"{PYTORCH_INDEX}/rocm{m.group(1)}.{m.group(2)}", False) if m else (None, False)
    if header.cuda:
        tag = cuda_tag(header.cuda)
        return (f"{PYTORCH_INDEX}/{tag}", False) if tag else (None, False)
    return f"{PYTORCH_INDEX}/cpu", False


def header_lines(header: Header) -> list[str]:
    lines = [
        f"# Frozen by {header.by} (%gpuenv --freeze) on {header.when}",
        f"# Python {header.python} on {_one_line(header.platform)}",
    ]
    index, needed = torch_index(header)
    if header.torch_version is None:
        lines.append("# torch: not installed")
    else:
        lines.append(f"# torch {header.torch_version}: {header.torch_build} build")
        if index and needed:
            lines.append(
                "# This torch build is published on the PyTorch wheel index, not on PyPI, "
                f"hence --extra-index-url {index}"
            )
        elif index:
            lines.append(
                f"# torch came from PyPI; the same {header.torch_build} build is also on "
                f"--extra-index-url {index}"
            )
    return lines


def requirements_text(installed: Iterable[Installed], header: Header) -> str:
    lines = header_lines(header)
    index, needed = torch_index(header)
    if index and needed:
        lines.append(f"--extra-index-url {index}")
    lines.extend(pin_line(d)[0] for d in installed)
    return "\n".join(lines) + "\n"


def environment_text(installed: Iterable[Installed], header: Header, name: str) -> str:
    """A conda environment.yml: conda supplies Python, pip installs the pins (conda passes the
    pip section to pip as a requirements file, so ``--extra-index-url`` works there too).
    Strings are written as JSON, which YAML reads as double-quoted scalars."""
    py = ".".join(header.python.split(".")[:2])
    lines = [*header_lines(header)]
    lines += [
        f"name: {json.dumps(name)}",
        "channels:",
        "  - conda-forge",
        "dependencies:",
        f"  - {json.dumps('python=' + py)}",
        "  - pip",
        "  - pip:",
    ]
    index, needed = torch_index(header)
    if index and needed:
        lines.append(f"      - {json.dumps('--extra-index-url ' + index)}")
    for dist in installed:
        line, pinned = pin_line(dist)
        if pinned:
            req = line.split("  # ", 1)[0]
            lines.append(f"      - {json.dumps(req)}")
        else:
            lines.append(f"      {line}")
    return "\n".join(lines) + "\n"


def env_name() -> str:
    """The conda environment's name when in one, else the virtualenv folder's name."""
    name = os.environ.get("CONDA_DEFAULT_ENV") or Path(sys.prefix).name.lstrip(".")
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name) or "env"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def freeze_dockerfile(target: Path, header: Header, installed: list[Installed]) -> FreezeResult:
    """Write ``target`` (a Dockerfile) and the pinned requirements beside it (issue 12)."""
    from gpumagic.environment.docker import (
        TORCH_FAMILY,
        choose_base_image,
        dockerfile_text,
        requirements_name,
    )

    if header.hip:
        raise FreezeError(
            f"torch {header.torch_version} is a ROCm build: a Dockerfile is written for CUDA "
            "(nvidia/cuda) and CPU builds only; freeze to requirements.txt instead"
        )
    requirements = requirements_name(target)
    base = choose_base_image(header.cuda, header.cudnn, header.python)
    index, _ = torch_index(header)
    if header.torch_version is not None and index is None:
        index = f"{PYTORCH_INDEX}/cpu" if header.cuda is None else None
    lines = [pin_line(d) for d in installed]
    torch_pins = [
        line.split("  #", 1)[0]
        for d, (line, pinned) in zip(installed, lines)
        if canonical(d.name) in TORCH_FAMILY and pinned and " @ " not in line
    ]
    docker = dockerfile_text(
        header,
        requirements.name,
        base,
        index,
        torch_pins=torch_pins,
        has_jupyterlab=any(canonical(d.name) == "jupyterlab" for d in installed),
        local=[d.name for d, (_, pinned) in zip(installed, lines) if not pinned],
        dockerfile=target.name,
    )
    for path, text in ((requirements, requirements_text(installed, header)), (target, docker)):
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise FreezeError(f"cannot write {os.fspath(path)!r}: {exc.strerror or exc}") from exc
    return FreezeResult(
        path=os.path.abspath(target),
        format=DOCKERFILE,
        pinned=sum(1 for _, pinned in lines if pinned),
        commented=[d.name for d, (_, pinned) in zip(installed, lines) if not pinned],
        index_url=index,
        base_image=base.tag,
        base_image_why=base.why,
        requirements_path=os.path.abspath(requirements),
    )
