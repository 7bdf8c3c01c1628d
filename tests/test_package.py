"""The package as a user meets it: what ``%load_ext gpumagic`` costs, the command's names,
and the metadata, README and Makefile kept in step (building and installing the package:
test_distribution.py).

The import and command checks run a fresh interpreter: ``sys.modules`` of the test process
already holds torch and numpy, and the console script is a separate program.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "pandas", "torch", "matplotlib")

LOAD_EXT = textwrap.dedent(
    """
    import json, sys
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    heavy = {heavy!r}
    before = [m for m in heavy if m in sys.modules]
    shell.run_line_magic("load_ext", "gpumagic")
    magics = shell.magics_manager.magics
    registered = sorted(magics["cell"]) + sorted(magics["line"])
    loaded = [m for m in heavy if m in sys.modules]
    shell.run_line_magic("unload_ext", "gpumagic")
    unloaded = [m for m in heavy if m in sys.modules]
    print(json.dumps({{"before": before, "loaded": loaded, "unloaded": unloaded,
                      "registered": registered}}))
    """
).format(heavy=HEAVY)


def _python(code: str, cwd: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_load_ext_imports_no_numpy_pandas_torch_or_matplotlib(tmp_path):
    # Those four cost ~90 ms (numpy) to seconds (torch) and the extension needs none of
    # them until a magic runs; the unload clean-up for %gpuwatch once imported the monitor,
    # and with it numpy, only to register itself.
    out = _python(LOAD_EXT, cwd=tmp_path)
    assert out["before"] == []  # IPython alone loads none of them: the check below means something
    assert {"memtrace", "gpuprofile", "gpuwatch", "gpuenv", "gpuselect"} <= set(out["registered"])
    assert out["loaded"] == []
    assert out["unloaded"] == []  # %unload_ext (nothing was watched) imports none of them either


def _console_script() -> Path:
    script = Path(sys.executable).parent / "gpumagic"
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable} (package not installed there)")
    return script


COMMANDS = {
    "console script": ("gpumagic", lambda: [str(_console_script())]),
    "python -m": ("python -m gpumagic", lambda: [sys.executable, "-m", "gpumagic"]),
}


@pytest.mark.parametrize("how", list(COMMANDS))
def test_every_usage_line_names_the_command_as_typed(how, tmp_path):
    name, command = COMMANDS[how]
    argv = command()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*argv, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )

    for sub in ("", "demo", "analyze"):
        done = run(*([sub] if sub else []), "--help")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"usage: {name} {sub}".rstrip() + " ["), done.stdout
    # argparse's own errors and the command's errors carry the same name
    missing = run("analyze")
    assert missing.returncode == 2
    assert f"usage: {name} analyze [" in missing.stderr
    assert f"{name} analyze: error: the following arguments are required: path" in missing.stderr
    absent = run("analyze", str(tmp_path / "absent.json"))
    assert absent.returncode == 1
    assert absent.stderr.startswith(f"{name} analyze: "), absent.stderr
    rows = run("analyze", "--rows", "0", str(tmp_path / "absent.json"))
    assert rows.stderr == f"{name} analyze: --rows must be at least 1\n"
    assert run().stderr.startswith(f"usage: {name} [")  # no subcommand


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_python_versions_agree_floor_classifiers_and_checkers():
    # ruff and mypy are what hold the code to the oldest Python it claims (no interpreter
    # of that version runs the tests here), so all four must name the same floor.
    config = _pyproject()
    floor = config["project"]["requires-python"]
    assert floor.startswith(">=")
    floor = floor[2:]
    prefix = "Programming Language :: Python :: "
    versions = [c[len(prefix):] for c in config["project"]["classifiers"] if c.startswith(prefix)]
    minors = sorted(tuple(map(int, v.split("."))) for v in versions if v.count(".") == 1)
    assert minors and ".".join(map(str, minors[0])) == floor
    assert minors == [(3, m) for m in range(minors[0][1], minors[-1][1] + 1)]  # no gap
    assert config["tool"]["ruff"]["target-version"] == "py" + floor.replace(".", "")
    assert config["tool"]["mypy"]["python_version"] == floor


def test_license_file_matches_the_metadata():
    project = _pyproject()["project"]
    assert project["license"] == "BSD-3-Clause"
    assert project["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License\n")
    assert "Copyright (c) " in text and "the gpumagic developers" in text
    assert "Neither the name of the copyright holder" in text  # the third clause
    assert (REPO / "gpumagic" / "py.typed").is_file()
    assert "py.typed" in _pyproject()["tool"]["setuptools"]["package-data"]["gpumagic"]


def test_developer_tools_are_in_dev_and_make_setup_installs_what_test_and_lint_use():
    extras = _pyproject()["project"]["optional-dependencies"]

    def names(extra: str) -> set[str]:
        return {r.split(">")[0].split("=")[0].split(";")[0].strip() for r in extras[extra]}

    tools = {"ruff", "mypy", "import-linter"}
    assert tools <= names("dev")
    assert not tools & names("test")
    makefile = (REPO / "Makefile").read_text()
    (line,) = [ln for ln in makefile.splitlines() if "pip install" in ln and "-e" in ln]
    installed = set(line.split("[", 1)[1].split("]", 1)[0].split(","))
    assert {"test", "dev"} <= installed  # make test, make lint (and .ci/run) on a fresh machine
    lint = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "$(BIN)/ruff" in lint and "$(BIN)/mypy" in lint and "$(BIN)/lint-imports" in lint


def test_readme_opens_with_the_repository_commands_then_the_install():
    readme = (REPO / "README.md").read_text()
    first_block = readme.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert [ln.split()[:2] for ln in first_block] == [["make", "lab"], ["make", "test"]]
    before_the_magics = readme.split("\n## What it does", 1)[0]
    for words in ("%load_ext gpumagic", "pip install ."):
        assert words in before_the_magics, words
    # nothing is published: no install from a package index is offered
    assert not re.search(r"pip install ['\"]?gpumagic", readme)
    for extra in _pyproject()["project"]["optional-dependencies"]:
        named = f"`{extra}`" in before_the_magics or f"gpumagic[{extra}]" in before_the_magics
        assert named, f"the README does not say what the {extra!r} extra is for"
