"""The release as a user gets it: ``python -m build``, then the wheel in a fresh venv.

The build runs on a copy of what git knows (tracked and untracked files, less the ignored
ones), as a clean clone would have it, so neither the checkout's ``.venv`` and build
leftovers nor a concurrent run touch it. ``python -m build`` makes the sdist and then
builds the wheel from the unpacked sdist, so the wheel installed below also proves the
sdist complete. The fresh venv resolves the wheel's own dependencies (torch pinned to the
version this environment runs, which pip takes from the machine's disk or its cache:
never an unpinned torch, which would be a CUDA build of several GB), so a module the
package imports without declaring it fails here.

Marked ``slow`` (about a minute, most of it installing torch): ``make test`` runs them,
``-m "not slow"`` leaves them out.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Dists:
    source: Path  # the copy the build ran in
    sdist: Path
    wheel: Path


def _git_files() -> list[str]:
    try:
        done = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )
    except FileNotFoundError:
        pytest.skip("git is not installed: the build copies the files git knows")
    if done.returncode != 0:
        pytest.skip(f"not a git checkout ({done.stderr.strip()}): nothing to build from")
    return [f for f in done.stdout.split("\0") if f and (REPO / f).is_file()]


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> Dists:
    source = tmp_path_factory.mktemp("checkout")
    for name in _git_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (sdist,) = out.glob("gpumagic-*.tar.gz")
    (wheel,) = out.glob("gpumagic-*.whl")
    return Dists(source, sdist, wheel)


def _package_modules(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in (root / "gpumagic").rglob("*.py")}


def test_sdist_ships_no_tests_and_what_builds_the_wheel(dists):
    # The tests exercise the repository (notebooks, binder/, tools/, benchmarks/, the
    # Makefile, ../shared/traces) and run from a checkout; setuptools' default shipped
    # tests/test*.py without conftest.py and their helpers, a tree that failed collection.
    with tarfile.open(dists.sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert not [n for n in names if n == "tests" or n.startswith("tests/")]
    assert not [n for n in names if Path(n).name.startswith(("test_", "conftest"))]
    assert {"LICENSE", "README.md", "pyproject.toml", "gpumagic/py.typed"} <= names
    assert _package_modules(dists.source) <= names  # every module of the package, none lost


def test_wheel_carries_license_types_and_metadata(dists):
    with zipfile.ZipFile(dists.wheel) as whl:
        names = set(whl.namelist())
        (info,) = {n.split("/", 1)[0] for n in names if n.endswith(".dist-info/METADATA")}
        meta = Parser().parsestr(whl.read(f"{info}/METADATA").decode())
        license_text = whl.read(f"{info}/licenses/LICENSE").decode()
    assert "gpumagic/py.typed" in names
    assert _package_modules(dists.source) <= names
    assert not [n for n in names if n.startswith("tests/")]
    assert "BSD 3-Clause License" in license_text and "the gpumagic developers" in license_text
    assert meta["License-Expression"] == "BSD-3-Clause"
    assert meta["Requires-Python"] == ">=3.10"
    assert meta["Author"] == "the gpumagic developers"
    assert meta["Keywords"]
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers
    assert "Programming Language :: Python :: 3.10" in classifiers
    assert {u.split(",", 1)[0] for u in meta.get_all("Project-URL")} >= {
        "Homepage", "Repository", "Issues", "Documentation"
    }
    assert "%load_ext gpumagic" in meta.get_payload()  # the README is the package's page
    extras = meta.get_all("Provides-Extra")
    assert {"test", "dev"} <= set(extras)
    test_extra = [r for r in meta.get_all("Requires-Dist") if 'extra == "test"' in r]
    assert not [r for r in test_extra if r.split(">")[0] in ("ruff", "mypy", "import-linter")]


CELL = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from IPython.core.interactiveshell import InteractiveShell
    import gpumagic

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gpumagic")
    result = shell.run_cell(
        "%%memtrace --quiet\\n"
        "import torch\\n"
        "x = torch.ones(512, 512)\\n"
        "y = x * 2\\n"
        "y.sum().item()\\n"
    )
    trace = shell.user_ns["_memtrace"]
    print(json.dumps({
        "file": gpumagic.__file__,
        "typed": (Path(gpumagic.__file__).parent / "py.typed").is_file(),
        "success": result.success,
        "value": result.result,
        "sources": list(trace.lines["source"]),
        "text": trace._text(),
    }))
    """
)


def test_wheel_installs_in_a_fresh_venv_and_runs_a_memtrace_cell(dists, tmp_path, monkeypatch):
    torch = importlib.metadata.version("torch").split("+")[0]
    venv = tmp_path / "venv"
    # a PYTHONPATH pointing at a checkout (a developer's worktree) would be imported first
    monkeypatch.delenv("PYTHONPATH", raising=False)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        py = venv / "bin" / "python"
        install = subprocess.run(
            [str(py), "-m", "pip", "install", "--no-input", "--no-compile", "-q",
             str(dists.wheel), f"torch=={torch}"],
            capture_output=True, text=True, timeout=400,
        )
        assert install.returncode == 0, install.stdout[-4000:] + install.stderr[-4000:]
        check = subprocess.run([str(py), "-m", "pip", "check"], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr

        # cwd outside the checkout: the package must come from the venv, not from here
        done = subprocess.run(
            [str(py), "-c", CELL], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-4000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert Path(out["file"]).is_relative_to(venv)
        assert out["typed"]
        assert out["success"]
        assert out["value"] == 2.0 * 512 * 512
        assert out["sources"] == ["import torch", "x = torch.ones(512, 512)", "y = x * 2", "y.sum().item()"]
        assert "x = torch.ones(512, 512)" in out["text"]

        for argv, name in (([str(venv / "bin" / "gpumagic")], "gpumagic"),
                           ([str(py), "-m", "gpumagic"], "python -m gpumagic")):
            helped = subprocess.run([*argv, "analyze", "--help"], cwd=tmp_path,
                                    capture_output=True, text=True, timeout=120)
            assert helped.returncode == 0, helped.stderr
            assert helped.stdout.startswith(f"usage: {name} analyze ["), helped.stdout
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # ~1.3 GB; pytest keeps tmp_path for 3 runs
