"""Reading a trace file: ahead in a thread, inflated by ISA-L or zlib, the same bytes and the
same errors whichever reads it (issue 27: the speed of `gpumagic analyze`)."""

from __future__ import annotations

import gzip
import zlib

import pytest
from profile_helpers import trace_path

from gpumagic.profile import TraceError
from gpumagic.profile.trace import files
from gpumagic.profile.trace.files import read_ahead, read_trace_bytes


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
