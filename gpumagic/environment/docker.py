"""``%gpuenv --freeze Dockerfile``: the frozen environment as an image you can rebuild anywhere.

The base is NVIDIA's ``nvidia/cuda`` cuDNN runtime image of the CUDA version torch was built
with (``python:X.Y-slim`` for a CPU build). torch's pip wheels bring their own CUDA runtime
and cuDNN (the ``nvidia-*`` packages pinned in the requirements), so the image's copy is not
what torch loads; matching it still matters: the image's CUDA version is what the NVIDIA
container toolkit checks the host driver against (``NVIDIA_REQUIRE_CUDA``), and other
libraries in the image (ONNX Runtime, TensorRT, anything built against the system CUDA) use
its libraries. Where NVIDIA publishes no image for torch's CUDA and cuDNN, the nearest one is
taken and the Dockerfile says which and why.

``CUDA_IMAGES`` is the table of published ``nvidia/cuda:<version>-<cudnn>-runtime-ubuntu<release>``
tags (the last patch release of each CUDA minor; checked against the tags in use on Docker
Hub). Extend it when NVIDIA publishes a new minor; nothing here queries a registry.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class Toolchain(Protocol):
    """The interpreter and torch build a report or a freeze names (``EnvReport`` and
    ``freeze.Header`` have them; named structurally so that freeze, which writes the
    Dockerfile through this module, is not imported back)."""

    @property
    def python(self) -> str: ...
    @property
    def platform(self) -> str: ...
    @property
    def torch_version(self) -> str | None: ...
    @property
    def torch_build(self) -> str: ...


class Frozen(Toolchain, Protocol):
    """What the Dockerfile's header reads: the toolchain, and who froze it when."""

    @property
    def by(self) -> str: ...
    @property
    def when(self) -> str: ...


@dataclass(frozen=True)
class CudaImage:
    version: str  # "12.4.1"
    cudnn_tag: str  # the tag's cuDNN word: "cudnn8", "cudnn9", "cudnn" (= cuDNN 9)
    cudnn_major: int
    ubuntu: tuple[str, ...]

    @property
    def minor(self) -> tuple[int, int]:
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)

    def tag(self, ubuntu: str) -> str:
        return f"nvidia/cuda:{self.version}-{self.cudnn_tag}-runtime-ubuntu{ubuntu}"


CUDA_IMAGES: tuple[CudaImage, ...] = (
    CudaImage("11.8.0", "cudnn8", 8, ("20.04", "22.04")),
    CudaImage("12.0.1", "cudnn8", 8, ("20.04", "22.04")),
    CudaImage("12.1.1", "cudnn8", 8, ("20.04", "22.04")),
    CudaImage("12.2.2", "cudnn8", 8, ("20.04", "22.04")),
    CudaImage("12.3.2", "cudnn9", 9, ("20.04", "22.04")),
    CudaImage("12.4.1", "cudnn", 9, ("20.04", "22.04")),
    CudaImage("12.5.1", "cudnn", 9, ("20.04", "22.04")),
    CudaImage("12.6.3", "cudnn", 9, ("20.04", "22.04", "24.04")),
    CudaImage("12.8.1", "cudnn", 9, ("20.04", "22.04", "24.04")),
    CudaImage("12.9.1", "cudnn", 9, ("20.04", "22.04", "24.04")),
    CudaImage("13.0.3", "cudnn", 9, ("22.04", "24.04")),
    CudaImage("13.1.1", "cudnn", 9, ("22.04", "24.04")),
    CudaImage("13.2.1", "cudnn", 9, ("22.04", "24.04")),
)

# The Python each Ubuntu release ships (apt's python3); any other version comes from the
# deadsnakes PPA, the usual source of other Pythons on Ubuntu.
UBUNTU_PYTHON = {"20.04": "3.8", "22.04": "3.10", "24.04": "3.12"}
PREFERRED_UBUNTU = "22.04"  # the release every image from 11.8 to 13.x is published for

# Packages published on the PyTorch wheel index for each build: installed from there, first.
TORCH_FAMILY = ("torch", "torchvision", "torchaudio")
JUPYTER_PORT = 8888


@dataclass(frozen=True)
class BaseImage:
    """The ``FROM`` line and why: ``exact`` is False when the nearest image stands in."""

    tag: str
    python: str  # "3.11"
    apt_python: bool  # Python comes from apt (nvidia/cuda) rather than the image (python:slim)
    deadsnakes: bool
    exact: bool
    why: list[str] = field(default_factory=list)


def _version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", text)
    if m is None:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def _major_minor_python(python: str) -> str:
    v = _version(python)
    return f"{v[0]}.{v[1]}" if v and len(v) >= 2 else python


def choose_base_image(
    cuda: str | None,
    cudnn: str | None,
    python: str,
    images: Sequence[CudaImage] = CUDA_IMAGES,
) -> BaseImage:
    """The base image for torch built with ``cuda`` (``torch.version.cuda``; None: a CPU build)
    and ``cudnn`` (``"9.1.0"``), running ``python`` (``"3.11.7"``)."""
    py = _major_minor_python(python)
    if cuda is None:
        return BaseImage(
            f"python:{py}-slim",
            py,
            apt_python=False,
            deadsnakes=False,
            exact=True,
            why=[f"a CPU build of torch: the official Python image python:{py}-slim (Debian), no CUDA"],
        )
    want = _version(cuda)
    if want is None or len(want) < 2:
        raise ValueError(f"cannot read torch's CUDA version {cuda!r}")
    wanted = (want[0], want[1])
    dnn = _version(cudnn)
    dnn_major = dnn[0] if dnn else None
    why: list[str] = []
    same_major = [i for i in images if i.minor[0] == wanted[0]] or list(images)
    pool = [i for i in same_major if dnn_major is None or i.cudnn_major == dnn_major]
    if not pool:
        pool = same_major
        why.append(
            f"no nvidia/cuda image pairs CUDA {wanted[0]}.x with cuDNN {dnn_major}: "
            f"the image's cuDNN is {same_major[0].cudnn_major} (torch loads the cuDNN its own "
            "wheel pins, so this only affects other libraries)"
        )

    def distance(i: CudaImage) -> tuple[int, int, int]:
        major, minor = i.minor
        # Nearest minor; on a tie the older one (it asks for a less new host driver).
        return (abs(major - wanted[0]) * 100 + abs(minor - wanted[1]), minor, 0)

    image = min(pool, key=distance)
    exact = image.minor == wanted and (dnn_major is None or image.cudnn_major == dnn_major)
    built = f"torch was built with CUDA {cuda}" + (f" and cuDNN {cudnn}" if cudnn else "")
    if image.minor == wanted:
        why.insert(
            0,
            f"{built}: nvidia/cuda {image.version} is the last CUDA {wanted[0]}.{wanted[1]} "
            f"release with cuDNN {image.cudnn_major}",
        )
    else:
        why.insert(
            0,
            f"{built}, and NVIDIA publishes no cuDNN runtime image of CUDA {wanted[0]}.{wanted[1]}: "
            f"chose {image.version}, the nearest CUDA {'release' if image.minor[0] == wanted[0] else 'major'}"
            + (
                " (newer: the host driver must support it)"
                if image.minor > wanted
                else " (older: torch's own CUDA libraries still come from its wheels)"
            ),
        )
    ubuntu, native = _ubuntu_for(py, image.ubuntu)
    if native:
        why.append(f"Ubuntu {ubuntu}, whose own Python is {py}")
    else:
        why.append(
            f"Ubuntu {ubuntu} ships Python {UBUNTU_PYTHON.get(ubuntu, '?')}, not {py}: "
            f"python{py} comes from the deadsnakes PPA"
        )
    return BaseImage(image.tag(ubuntu), py, apt_python=True, deadsnakes=not native, exact=exact, why=why)


def _ubuntu_for(py: str, releases: Sequence[str]) -> tuple[str, bool]:
    for release in releases:
        if UBUNTU_PYTHON.get(release) == py and release != "20.04":  # 20.04 is past its support
            return release, True
    if PREFERRED_UBUNTU in releases:
        return PREFERRED_UBUNTU, False
    return releases[-1], False


def requirements_name(dockerfile: Path) -> Path:
    """Where the pinned requirements go, beside the Dockerfile: ``requirements.frozen.txt``
    (``train.Dockerfile`` -> ``train.requirements.frozen.txt``). Not ``requirements.txt``:
    that name is usually the project's own, hand-written file."""
    name = dockerfile.name
    if name.lower().endswith(".dockerfile"):
        return dockerfile.with_name(f"{name[: -len('.dockerfile')]}.requirements.frozen.txt")
    return dockerfile.with_name("requirements.frozen.txt")


def dockerfile_text(
    header: Frozen,
    requirements: str,
    base: BaseImage,
    index_url: str | None,
    *,
    torch_pins: Sequence[str],
    has_jupyterlab: bool,
    local: Sequence[str],
    dockerfile: str = "Dockerfile",
) -> str:
    """The Dockerfile: ``requirements`` is the requirements file's name, beside it (the build
    context is the Dockerfile's folder); ``torch_pins`` the ``torch==...`` lines installed from
    ``index_url`` first; ``local`` the distributions installed from local folders."""
    lines = _dockerfile_header(header, requirements, base, dockerfile)
    lines += [
        f"FROM {base.tag}",
        "",
        "ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 "
        "PIP_DISABLE_PIP_VERSION_CHECK=1",
    ]
    if base.apt_python:
        lines += _python_from_apt(base)
    lines += ["", "WORKDIR /workspace", f"COPY {requirements} /tmp/{requirements}"]
    if torch_pins and index_url:
        lines += [
            f"# torch first, from the PyTorch index of its build ({index_url.rsplit('/', 1)[-1]}): "
            "PyPI's torch is another build.",
            f"RUN pip install --index-url {index_url} {' '.join(torch_pins)}",
        ]
    lines.append(f"RUN pip install -r /tmp/{requirements}")
    if not has_jupyterlab:
        lines += [
            "# JupyterLab was not installed in the frozen environment; the CMD needs it (unpinned).",
            "RUN pip install jupyterlab",
        ]
    if local:
        lines.append(
            "# Not in the image (installed from local folders, see the comments in "
            f"{requirements}): {', '.join(local)}. COPY them in and pip install them."
        )
    cmd = [
        "jupyter",
        "lab",
        "--ip=0.0.0.0",
        f"--port={JUPYTER_PORT}",
        "--no-browser",
        "--allow-root",
        "--ServerApp.root_dir=/workspace",
    ]
    lines += ["", f"EXPOSE {JUPYTER_PORT}", f"CMD {json.dumps(cmd)}"]
    return "\n".join(lines) + "\n"


def _dockerfile_header(
    header: Frozen, requirements: str, base: BaseImage, dockerfile: str
) -> list[str]:
    """The comments on top: what was frozen, from where, why this base, how to build and run."""
    lines = [
        f"# Frozen by {header.by} (%gpuenv --freeze) on {header.when}",
        f"# from Python {header.python} on {_one_line(header.platform)}; torch "
        + (f"{header.torch_version} ({header.torch_build})" if header.torch_version else "not installed"),
        f"# Base image {base.tag}:",
        *(f"#   {w}." for w in base.why),
    ]
    if base.apt_python:
        lines.append(
            "#   torch's wheels bring their own CUDA runtime and cuDNN (the nvidia-* pins in "
            f"{requirements}); the image's CUDA version is what the host driver is checked against."
        )
    if not header.platform.lower().startswith("linux"):
        lines.append(
            f"# Frozen on {header.platform.split('-')[0]}, not Linux: pins of platform-only "
            "packages may need removing for the image."
        )
    lines += [
        "# Build with this folder as the context:",
        f"#   docker build -t frozen-env -f {dockerfile} .",
        "# Run:",
        f"#   docker run {'--gpus all ' if base.apt_python else ''}-p {JUPYTER_PORT}:{JUPYTER_PORT} -v \"$PWD\":/workspace frozen-env",
    ]
    return lines


def _python_from_apt(base: BaseImage) -> list[str]:
    """Python from the distribution (deadsnakes where Ubuntu lacks the version) in a venv."""
    py = base.python
    apt = ["ca-certificates", f"python{py}", f"python{py}-venv"]
    steps = ["apt-get update"]
    if base.deadsnakes:
        steps += [
            "apt-get install -y --no-install-recommends software-properties-common gpg-agent",
            "add-apt-repository -y ppa:deadsnakes/ppa",
            "apt-get update",
        ]
    steps += [
        f"apt-get install -y --no-install-recommends {' '.join(apt)}",
        "rm -rf /var/lib/apt/lists/*",
    ]
    return [
        "# A virtual environment: Ubuntu's own Python refuses pip installs (PEP 668).",
        "RUN " + " \\\n && ".join(steps),
        f"RUN python{py} -m venv /opt/venv",
        'ENV PATH="/opt/venv/bin:$PATH"',
    ]


def _one_line(text: str) -> str:
    return " ".join(text.split())
