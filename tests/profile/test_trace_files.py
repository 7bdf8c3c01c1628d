"""Reading a trace file: ahead in a thread, inflated by ISA-L or zlib, the same bytes and the
same errors whichever reads it (issue 27: the speed of `gpumagic analyze`)."""

from __future__ import annotations

import gzip
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest
from profile_helpers import trace_path

from gpumagic.profile import TraceError
from gpumagic.profile.trace import files
from gpumagic.profile.trace.files import read_ahead, read_trace_bytes

REPO = Path(__file__).resolve().parents[2]


def test_a_file_read_ahead_is_read_once_and_handed_to_the_next_read(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes(trace_path("cpu_only.json.gz").read_bytes())
    direct = read_trace_bytes(p)
    read_ahead(str(p))
    files._AHEAD[files._key(p)].result()  # the thread is done with the file
    p.unlink()  # so the next read can only be the one made ahead
    assert read_trace_bytes(p) == direct
    with pytest.raises(TraceError, match="no such file"):  # handed over once, not kept
        read_trace_bytes(p)


def test_a_file_read_ahead_raises_what_a_direct_read_raises(tmp_path):
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(trace_path("cpu_only.json.gz").read_bytes()[:500])
    for p in (cut, tmp_path / "missing.json"):
        with pytest.raises(TraceError) as direct:
            read_trace_bytes(p)
        read_ahead(p)
        with pytest.raises(TraceError) as ahead:
            read_trace_bytes(p)
        assert str(ahead.value) == str(direct.value)


def test_isal_inflates_to_zlibs_bytes_or_leaves_the_file_to_zlib(tmp_path):
    if files._isal_decompressobj is None:
        pytest.skip("isal is not installed here: the loader uses zlib only")
    data = trace_path("a100_training_control.json.gz").read_bytes()
    assert files._inflate_fast(data) == zlib.decompressobj(47).decompress(data)
    members = gzip.compress(b'{"traceEvents": [') + gzip.compress(b"]}")
    assert files._inflate_fast(members) == b'{"traceEvents": []}'
    # cut short, an unknown method, a bad block: zlib reads them again and says what is wrong
    corrupt = bytearray(data[:4000])
    corrupt[20:40] = b"\x00" * 20
    for bad in (data[: len(data) // 2], b"\x1f\x8bgarbage", bytes(corrupt)):
        assert files._inflate_fast(bad) is None


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


def test_analyze_of_one_file_imports_no_process_pool():
    # a folder's ranks go to a process pool; one file's report needs none of it (issue 27:
    # imports paid only for what a report needs)
    code = (
        "import contextlib, io, sys\n"
        "from gpumagic.profile.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main([{str(trace_path('cpu_only.json.gz'))!r}]) == 0\n"
        "print(sorted(m for m in ('multiprocessing', 'concurrent.futures.process') "
        "if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "[]"
