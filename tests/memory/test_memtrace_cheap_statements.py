"""A cheap statement costs %%memtrace no reading (issue 27 item 1): a statement that makes,
frees and moves no tensor settles to the last settlement, and the host's RSS is read at most
once a millisecond. The figures stay those of a reading at every boundary. Through IPython."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpumagic.memory.trace import readers  # noqa: E402

CELL = (
    "%%memtrace -q\n"
    "x = torch.ones(1000)\n"
    "acc = 0\n"
    "for i in range(3000):\n"
    "    a = i + 1\n"
    "    acc = acc + a\n"
    "y = torch.ones(10)\n"
)


@pytest.fixture(autouse=True)
def _torch_in_namespace(ip):
    ip.user_ns["torch"] = torch


def test_cheap_statements_read_the_host_rarely_and_their_rows_stay_exact(ip, run, monkeypatch):
    reads = []
    real_read = readers.HostMemory.read

    def counting_read(self):
        reads.append(1)
        return real_read(self)

    monkeypatch.setattr(readers.HostMemory, "read", counting_read)
    r = run(CELL)
    assert r.result.success, r.result.error_in_exec
    t = ip.user_ns["_memtrace"]
    rows = t.lines.set_index("line")
    boundaries = int(rows.hits.sum())
    assert boundaries > 9000
    # about 9,000 cheap statements take a few milliseconds: a reading a millisecond, not one
    # a statement (read at every boundary, there were more readings than statements)
    assert len(reads) < boundaries / 10, (len(reads), boundaries)
    assert rows.loc[5].hits == 3000 and rows.loc[6].hits == 3000
    for line in (3, 4, 5, 6):
        assert rows.loc[line, "delta_bytes"] == 0 and rows.loc[line, "peak_bytes"] == 0
        assert rows.loc[line, "allocated_bytes"] == 4000 and rows.loc[line, "inputs_bytes"] == 4000
    assert rows.loc[7, "delta_bytes"] == 40 and rows.loc[7, "allocated_bytes"] == 4040
    # every point of the timeline adds up by category to the bytes allocated then
    timeline = t.timeline
    totals = timeline[timeline.point == "after"].groupby("step")["bytes"].sum()
    allocated = {k: p[1] for k, p in enumerate(t.points)}
    assert all(totals[k] == allocated[k] for k in totals.index)
    assert t.at_peak.total == 4040
