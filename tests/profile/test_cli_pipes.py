"""``python -m gpumagic ... | head -1`` ends quietly: no BrokenPipeError traceback.

Each command runs in a real subprocess whose stdout is a real pipe into ``head -1``.
Whether the command writes before or after ``head`` has gone is a race when the output
is small, so the decisive case makes it certain, as it happens with a slow command:
``head`` takes its one line from an ``echo`` first and has exited before the command
writes anything. The command must then say nothing on stderr and exit 141 (128 +
SIGPIPE, as ``cat`` or ``grep`` do when the pipe closes under them).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from profile_helpers import trace_path

REPO = Path(__file__).resolve().parents[2]  # cwd of the commands: this checkout's gpumagic


def _pipeline(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", "set -o pipefail; " + script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _command(args: list[str]) -> str:
    return shlex.join([sys.executable, "-m", "gpumagic", *args])


@pytest.mark.parametrize("which", ["analyze", "analyze --html", "demo"])
def test_head_gone_before_the_first_write_ends_quietly(which, tmp_path):
    args = {
        "analyze": ["analyze", str(trace_path("cpu_only.json.gz"))],
        "analyze --html": [
            "analyze",
            str(trace_path("cpu_only.json.gz")),
            "--html",
            str(tmp_path / "report.html"),
        ],
        "demo": ["demo", "--out", str(tmp_path)],
    }[which]
    done = _pipeline(f"{{ echo first; {_command(args)}; }} | head -1")
    assert done.stdout == "first\n"
    assert done.stderr == ""  # no traceback, no "Exception ignored ... BrokenPipeError"
    assert done.returncode == 141  # the command's status: the pipe closed under it
    if which == "analyze --html":
        assert (tmp_path / "report.html").stat().st_size > 0  # the file asked for is written


def test_analyze_into_head_prints_the_first_line_and_nothing_else(tmp_path):
    path = trace_path("cpu_only.json.gz")
    full = _pipeline(_command(["analyze", str(path)]))
    assert full.returncode == 0, full.stderr
    out = tmp_path / "report.html"
    done = _pipeline(f"{_command(['analyze', str(path), '--html', str(out)])} | head -1")
    assert done.stdout == full.stdout.splitlines(keepends=True)[0]
    assert done.stderr == ""
    # 0 when the whole report fitted the pipe before head left, 141 when it did not
    assert done.returncode in (0, 141)
