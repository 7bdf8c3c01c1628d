"""binder/ (what mybinder.org reads) agrees with pyproject.toml: same runtime dependencies with
compatible specifiers, torch from the CPU wheel index, postBuild installs the package itself."""

from __future__ import annotations

import os
import re
import shlex
import stat
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import Specifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
BINDER = REPO / "binder"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
LOWER = (">=", ">", "==", "~=", "===")
UPPER = ("<", "<=", "==", "~=", "===")


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _project_requirements() -> dict[str, Requirement]:
    return {
        canonicalize_name(r.name): r
        for r in map(Requirement, _pyproject()["project"]["dependencies"])
    }


def _all_project_requirements() -> dict[str, list[Requirement]]:
    """Runtime and optional dependencies: everything pyproject says about a package."""
    project = _pyproject()["project"]
    lines = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        lines.extend(extra)
    out: dict[str, list[Requirement]] = {}
    for r in map(Requirement, lines):
        out.setdefault(canonicalize_name(r.name), []).append(r)
    return out


def _binder_lines() -> list[str]:
    lines = []
    for raw in (BINDER / "requirements.txt").read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def _binder_requirements() -> dict[str, Requirement]:
    reqs = [Requirement(line) for line in _binder_lines() if not line.startswith("-")]
    out = {canonicalize_name(r.name): r for r in reqs}
    assert len(out) == len(reqs), "a package is listed twice in binder/requirements.txt"
    return out


def _postbuild_pip_args() -> list[list[str]]:
    """The arguments after ``pip install`` in each install command of postBuild."""
    calls = []
    for line in (BINDER / "postBuild").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.search(r"\bpip3?\s+install\s+(.*)", line)
        if m:
            calls.append(shlex.split(m.group(1)))
    return calls


def _bounds(spec: SpecifierSet, ops: tuple[str, ...]) -> list[Specifier]:
    return [s for s in spec if s.operator in ops]


def within(narrow: SpecifierSet, wide: SpecifierSet) -> bool:
    """Does every version ``narrow`` admits also satisfy ``wide``?  Checked at the bounds,
    which is exact for the ``>=``/``<``/``==`` specifiers requirement files use."""
    for s in _bounds(narrow, LOWER):  # narrow's lowest admitted versions lie inside wide
        if s.operator != ">" and not wide.contains(s.version, prereleases=True):
            return False
    for w in _bounds(wide, LOWER):  # wide's lower bounds are implied by one of narrow's
        if not any(Version(s.version) >= Version(w.version) for s in _bounds(narrow, LOWER)):
            return False
    for w in _bounds(wide, UPPER):  # and its upper bounds too
        if not any(Version(s.version) <= Version(w.version) for s in _bounds(narrow, UPPER)):
            return False
    for w in wide:  # exclusions: narrow must not pin the excluded version
        if w.operator == "!=" and any(
            s.operator == "==" and s.version == w.version for s in narrow
        ):
            return False
    return True


def test_within_can_fail():
    assert within(SpecifierSet(">=2.2"), SpecifierSet(">=2.1"))
    assert within(SpecifierSet("==2.3.1"), SpecifierSet(">=2.1"))
    assert within(SpecifierSet(">=2.1"), SpecifierSet(">=2.1"))
    assert not within(SpecifierSet(">=2.0"), SpecifierSet(">=2.1"))
    assert not within(SpecifierSet(""), SpecifierSet(">=2.1"))
    assert not within(SpecifierSet("==2.0.1"), SpecifierSet(">=2.1"))
    assert not within(SpecifierSet(">=2.1"), SpecifierSet(">=2.1,<3"))
    assert within(SpecifierSet(">=2.1,<2.5"), SpecifierSet(">=2.1,<3"))
    assert not within(SpecifierSet("==2.2"), SpecifierSet(">=2.1,!=2.2"))


def test_every_runtime_dependency_is_in_binder_with_a_compatible_specifier():
    binder = _binder_requirements()
    for name, req in _project_requirements().items():
        assert name in binder, f"binder/requirements.txt lacks {req}"
        got = binder[name]
        assert within(got.specifier, req.specifier), f"binder has {got}, pyproject requires {req}"
        assert got.extras >= req.extras, f"binder drops extras of {req}"


def test_torch_comes_from_the_cpu_index():
    lines = _binder_lines()
    options = [shlex.split(line) for line in lines if line.startswith("-")]
    indexes = [o[1] for o in options if o[0] in ("--extra-index-url", "--index-url") and len(o) > 1]
    assert CPU_INDEX in indexes, "torch would come from PyPI, whose Linux wheel is the CUDA build"
    torch = _binder_requirements()["torch"]
    assert not torch.url, "torch must come from the index, not a direct URL"
    for s in torch.specifier:
        assert "+cu" not in s.version and "+rocm" not in s.version, f"GPU build pinned: {torch}"
    # and postBuild installs no torch of its own from PyPI
    for args in _postbuild_pip_args():
        assert not any(
            canonicalize_name(a.split("=")[0].split("<")[0].split(">")[0]) == "torch" for a in args
        )


def test_no_binder_file_pins_what_pyproject_excludes():
    known = _all_project_requirements()
    pinned: list[Requirement] = list(_binder_requirements().values())
    for args in _postbuild_pip_args():
        pinned.extend(
            Requirement(a) for a in args if not a.startswith("-") and a not in (".", "./")
        )
    for req in pinned:
        for project_req in known.get(canonicalize_name(req.name), []):
            assert within(req.specifier, project_req.specifier), (
                f"binder wants {req}, pyproject says {project_req}"
            )


def test_postbuild_is_executable_and_installs_the_package():
    post = BINDER / "postBuild"
    mode = post.stat().st_mode
    assert mode & stat.S_IXUSR and os.access(post, os.X_OK), "repo2docker runs ./binder/postBuild"
    text = post.read_text()
    assert text.startswith("#!"), "postBuild needs a shebang to be executed directly"
    installs = _postbuild_pip_args()
    assert installs, "postBuild does not pip install anything"
    package = [args for args in installs if {".", "./"} & set(args) or "-e" in args]
    assert package, "postBuild does not install the package itself (pip install .)"
    # the dependencies come from requirements.txt (torch from the CPU index); re-resolving
    # them here could pull PyPI's CUDA torch
    assert all("--no-deps" in args for args in package)


def test_runtime_txt_python_satisfies_requires_python():
    runtime = (BINDER / "runtime.txt").read_text()
    # repo2docker reads the whole file as the version string: one line, no comments
    m = re.fullmatch(r"python-(\d+\.\d+)\s*", runtime)
    assert m, f"runtime.txt must be exactly 'python-X.Y', got {runtime!r}"
    requires = SpecifierSet(_pyproject()["project"]["requires-python"])
    assert requires.contains(m.group(1))


@pytest.mark.parametrize("name", ["requirements.txt", "postBuild"])
def test_binder_files_say_why(name):
    comments = [
        line
        for line in (BINDER / name).read_text().splitlines()
        if line.startswith("#") and not line.startswith("#!")
    ]
    assert comments, f"binder/{name} should say why it is as it is"
