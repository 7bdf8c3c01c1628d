"""The package as a user meets it: what ``%load_ext gpumagic`` costs, and the command's names.

Each check runs a fresh interpreter: ``sys.modules`` of the test process already holds
torch and numpy, and the console script is a separate program.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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
