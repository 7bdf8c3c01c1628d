"""What `gpumagic analyze` pays for, and no more (issue 27: the whole command against Holistic
Trace Analysis): the file read in a thread while the command imports, no process pool for one
file, no cycle collection at exit."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from profile_helpers import trace_path

from gpumagic.profile.trace import files

REPO = Path(__file__).resolve().parents[2]


def test_analyze_reads_the_file_in_a_thread_while_it_imports(monkeypatch, capsys):
    from gpumagic.profile import cli

    readers = []
    read = files._read

    def spy(path: Path) -> bytes:
        readers.append(threading.current_thread().name)
        return read(path)

    monkeypatch.setattr(files, "_read", spy)
    assert cli.main([str(trace_path("cpu_only.json.gz"))]) == 0
    assert readers == ["gpumagic-read-ahead"]
    assert "%%gpuprofile: cpu_only.json.gz" in capsys.readouterr().out


def test_analyze_prints_the_report_load_trace_gives():
    from gpumagic.profile.load import load_trace

    path = trace_path("v100_training_5steps.json.gz")
    out = subprocess.run(
        [sys.executable, "-m", "gpumagic", "analyze", str(path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    assert out == load_trace(path).to_text(rows=10) + "\n"


def test_analyze_of_one_file_imports_no_process_pool_nor_package_metadata():
    # a folder's ranks go to a process pool; one file's report needs none of it, and reads
    # torch's version from its version.py (issue 27: imports paid only for what a report needs)
    code = (
        "import contextlib, io, sys\n"
        "from gpumagic.profile.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main([{str(trace_path('cpu_only.json.gz'))!r}]) == 0\n"
        "from gpumagic.profile.rules.base import installed_torch\n"
        "assert installed_torch() is not None\n"
        "print(sorted(m for m in ('multiprocessing', 'concurrent.futures.process', "
        "'importlib.metadata') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "[]"


def test_the_command_skips_the_collector_at_exit_and_main_does_not(monkeypatch, capsys):
    import gpumagic.__main__ as command

    frozen = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))
    path = str(trace_path("cpu_only.json.gz"))
    assert command.main(["analyze", path]) == 0  # a caller's own process: collected as usual
    assert frozen == []
    monkeypatch.setattr(sys, "argv", ["gpumagic", "analyze", path])
    with pytest.raises(SystemExit) as exit_:
        command.run()
    assert exit_.value.code == 0 and frozen == [True]
    monkeypatch.setattr(sys, "argv", ["gpumagic", "analyze", path + ".missing"])
    with pytest.raises(SystemExit) as exit_:
        command.run()
    assert exit_.value.code == 1
    assert "%%gpuprofile: cpu_only.json.gz" in capsys.readouterr().out


def test_torch_version_from_its_version_file_or_its_metadata(monkeypatch, tmp_path):
    import importlib.metadata
    import importlib.util

    from gpumagic.profile.rules import base

    major, minor = importlib.metadata.version("torch").split(".")[:2]
    base.installed_torch.cache_clear()
    assert base.installed_torch() == (int(major), int(minor))
    # a torch whose version.py cannot be read: its metadata says
    spec = importlib.util.spec_from_file_location("torch", tmp_path / "torch" / "__init__.py")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    base.installed_torch.cache_clear()
    assert base.installed_torch() == (int(major), int(minor))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # no torch at all
    base.installed_torch.cache_clear()
    assert base.installed_torch() is None
    base.installed_torch.cache_clear()
