"""A directory of many rank traces: reduced in workers, summaries kept, ranks read on demand.

The jobs are written at run time from the two real rank traces (tests/job_traces.py): rank
N copies real rank N % 2, times shifted; the straggler's compute kernels run 1.6x longer.
"""

from __future__ import annotations

import gc
import gzip
from concurrent.futures import Executor, Future, ThreadPoolExecutor

import pandas as pd
import pytest
from cell_outputs import run_showing
from job_traces import write_job
from profile_helpers import TraceBuilder

from gpumagic.profile import ranks as ranks_module
from gpumagic.profile.analysis.trace_analysis import Analysis
from gpumagic.profile.load import load_trace
from gpumagic.profile.trace.errors import TraceError

STRAGGLER = 3


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Six ranks of one job; rank 3 is the straggler."""
    out = tmp_path_factory.mktemp("job") / "traces"
    write_job(out, ranks=6, straggler=STRAGGLER)
    return out


def _analyses_alive() -> int:
    gc.collect()
    return sum(type(o) is Analysis for o in gc.get_objects())


def _pool_everything(monkeypatch):
    # the generated job is small: without this the default reads it in this process
    monkeypatch.setattr(ranks_module, "POOL_MIN_BYTES", 0)


def test_the_default_pool_reduces_every_rank_in_a_worker(job, monkeypatch):
    _pool_everything(monkeypatch)
    before = _analyses_alive()
    r = load_trace(job)
    workers = min(6, ranks_module.usable_cpus())
    assert r.reduced_by == (f"a pool of {workers} processes" if workers > 1 else "this process")
    assert r.ranks == list(range(6))
    # the notebook holds summaries: no rank's events are in this process yet
    assert _analyses_alive() == before
    assert r.slowest_rank == STRAGGLER
    assert list(r.per_rank["slowest"]) == [rank == STRAGGLER for rank in range(6)]
    # the same numbers as each rank loaded alone, in this process
    for rank in (0, 1, STRAGGLER):
        alone = load_trace(job / f"rank-{rank}.json.gz").summary
        row = r.per_rank.set_index("rank").loc[rank]
        assert row["step_time_us"] == pytest.approx(alone.step_time_us)
        assert row["gpu_utilization_percent"] == pytest.approx(alone.gpu_utilization_percent)
        assert row["collective_us_per_step"] == pytest.approx(
            load_trace(job / f"rank-{rank}.json.gz").primary.collective_us_per_step
        )
    # copies of real rank 0 wait longer in collectives than copies of real rank 1, as there
    assert (
        r.per_rank.loc[0, "collective_wait_us_per_step"]
        > r.per_rank.loc[1, "collective_wait_us_per_step"]
    )
    # the report shows the slowest rank in full: its file is read again, and only its
    text = r.to_text()
    assert _analyses_alive() == before + 1
    assert r.summary.rank == STRAGGLER and r.summary.ranks == 6
    assert f"slowest: rank {STRAGGLER}" in text
    assert f"rank {STRAGGLER}: " in text and "more compute" in text


def test_a_rank_loads_in_full_on_demand_and_is_not_kept(job, monkeypatch):
    _pool_everything(monkeypatch)
    r = load_trace(job)
    before = _analyses_alive()
    one = r.rank(4)
    assert _analyses_alive() == before + 1
    assert one.summary.rank == 4 and one.summary.ranks == 1
    alone = load_trace(job / "rank-4.json.gz")
    pd.testing.assert_frame_equal(one.breakdown, alone.breakdown)
    pd.testing.assert_frame_equal(one.kernels, alone.kernels)
    assert one.findings and [f.rule for f in one.findings] == [f.rule for f in alone.findings]
    del one, alone
    assert _analyses_alive() == before
    with pytest.raises(KeyError, match="no rank 9"):
        r.rank(9)


def test_each_summary_carries_the_ranks_tables(job, monkeypatch):
    _pool_everything(monkeypatch)
    r = load_trace(job)
    s = r.rank_summaries[STRAGGLER]
    full = load_trace(job / f"rank-{STRAGGLER}.json.gz")
    assert s.declared_rank == STRAGGLER and s.file.endswith(f"rank-{STRAGGLER}.json.gz")
    assert len(s.steps) == 2 and list(s.steps["step"]) == list(full.steps["step"])
    pd.testing.assert_frame_equal(s.kernels, full.kernels.head(ranks_module.TOP_ROWS))
    pd.testing.assert_frame_equal(s.ops, full.ops.head(ranks_module.TOP_ROWS))
    assert s.idle_us_per_step == pytest.approx({k: v / 2 for k, v in full.idle.device_us.items()})
    assert set(s.collectives["name"]) == {"all_reduce", "all_to_all", "all_gather"}
    assert s.lines.empty and s.modules.empty  # not a %%gpuprofile trace, no stacks
    # the collectives of every rank, numbered as the job numbers them
    assert sorted(set(r.collectives["rank"])) == list(range(6))
    assert sorted(set(r.overlap["rank"])) == list(range(6))


def test_a_dask_cluster_executor_gives_the_same_result(job):
    distributed = pytest.importorskip("dask.distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        r = load_trace(job, executor=client.get_executor())
    assert r.reduced_by == "the executor given (ClientExecutor)"
    assert r.slowest_rank == STRAGGLER
    here = load_trace(job)  # small: read in this process
    assert here.reduced_by == "this process"
    pd.testing.assert_frame_equal(r.per_rank, here.per_rank)
    pd.testing.assert_frame_equal(r.slow_ranks, here.slow_ranks)


def test_any_executor_works_and_a_broken_rank_names_its_file(job, tmp_path):
    broken = tmp_path / "job"
    broken.mkdir()
    for f in sorted(job.iterdir())[:3]:
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "rank-1.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [')[:-8])
    with (
        ThreadPoolExecutor(2) as ex,
        pytest.raises(TraceError, match=r"rank-1\.json\.gz: the gzip"),
    ):
        load_trace(broken, executor=ex)


def test_a_broken_rank_names_its_file_from_the_default_pool(job, tmp_path, monkeypatch):
    _pool_everything(monkeypatch)
    broken = tmp_path / "job"
    broken.mkdir()
    for f in sorted(job.iterdir())[:3]:
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "rank-10.json.gz").write_text("not json")
    with pytest.raises(TraceError, match=r"rank-10\.json\.gz: "):
        load_trace(broken)


def _rank_trace(path, rank: int, *, compute: float, loader: float, allreduce: float | None):
    """Two steps of one rank: a DataLoader batch, a compute kernel, maybe an all-reduce."""
    b = TraceBuilder()
    b.distributed = {"backend": "nccl", "rank": rank, "world_size": 3}
    for i in range(2):
        t0 = 1000.0 + i * 50_000
        step = 100 + loader + compute + (allreduce or 0.0) + 100
        b.op(f"ProfilerStep#{i}", t0, step, cat="user_annotation")
        b.op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0 + 10, loader)
        t = t0 + 20 + loader
        b.op("aten::mm", t, 20)
        b.launch("ampere_sgemm_128x64_nn", t + 5, t + 30, compute)
        if allreduce is not None:
            a = t + 40 + compute
            b.op("nccl:all_reduce", a, 20, cat="user_annotation")
            b.launch(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                a + 5,
                a + 10,
                allreduce,
            )
    b.write(path / f"rank{rank}.json")


def test_what_makes_a_slow_rank_slow(tmp_path):
    # input stalls: rank 2 waits 4 ms per step for its DataLoader, the others 1 ms
    inputs = tmp_path / "input"
    inputs.mkdir()
    for rank in range(3):
        _rank_trace(inputs, rank, compute=2000, loader=4000 if rank == 2 else 1000, allreduce=None)
    slow = load_trace(inputs).slow_ranks
    assert list(slow["rank"]) == [2]
    assert slow.loc[0, "extra_input_us_per_step"] == pytest.approx(3000, rel=0.01)
    assert slow.loc[0, "reason"].startswith("input stalls (+3.0 ms per step in the DataLoader")
    # more compute, in a synchronised job: rank 0's kernels take 5 ms, the others wait for it
    sync = tmp_path / "sync"
    sync.mkdir()
    for rank in range(3):
        _rank_trace(
            sync,
            rank,
            compute=5000 if rank == 0 else 2000,
            loader=500,
            allreduce=300 if rank == 0 else 3300,
        )
    r = load_trace(sync)
    assert r.slowest_rank == 0
    assert list(r.slow_ranks["rank"]) == [0]
    assert r.slow_ranks.loc[0, "reason"].startswith("more compute (+3.0 ms per step")
    # waiting in collectives, where the ranks do not all synchronise: rank 1 spends 6 ms
    # per step in an all-reduce the others never call
    coll = tmp_path / "coll"
    coll.mkdir()
    for rank in range(3):
        _rank_trace(coll, rank, compute=2000, loader=500, allreduce=6000 if rank == 1 else None)
    slow = load_trace(coll).slow_ranks
    assert list(slow["rank"]) == [1]
    assert slow.loc[0, "reason"].startswith("waiting in collectives (+6.0 ms per step")
    # one rank: nothing to compare
    assert load_trace(coll / "rank0.json").slow_ranks.empty


def test_ranks_within_the_noise_are_not_named(job):
    r = load_trace(job)
    # the copies of real rank 1 do 3% more work per step than those of rank 0: within the noise
    assert list(r.slow_ranks["rank"]) == [STRAGGLER]


def test_every_rank_gets_its_own_number():
    from gpumagic.profile.ranks import number_ranks

    # declared ranks first, then numbers in names, then positions, never one number twice
    assert number_ranks([1, None, None], ["a.json", "b.json", "rank-1.json"]) == [1, 2, 3]
    assert number_ranks([0, 0, None], ["x.json", "rank_5.json", "y.json"]) == [0, 5, 2]
    assert number_ranks([None, None], ["rank3.json", "rank-3.json"]) == [3, 1]


# --- a folder as users leave it: broken links, copies, lost workers, corrupt numbers ----------


def _small_rank(path, rank: int, *, mm_us: float = 20.0) -> None:
    """A two-step rank that declares its number; ``mm_us`` is the first matmul's duration."""
    b = TraceBuilder()
    b.distributed = {"backend": "nccl", "rank": rank, "world_size": 3}
    for i in range(2):
        t0 = 1000.0 + i * 5000
        b.op(f"ProfilerStep#{i}", t0, 2000, cat="user_annotation")
        b.op("aten::mm", t0 + 10, mm_us if i == 0 else 20.0)
        b.launch("ampere_sgemm_128x64_nn", t0 + 15, t0 + 40, 500)
    b.write(path)


def _gz(path):
    path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()


@pytest.mark.parametrize("link", ["dangling", "loop"])
def test_a_broken_link_is_left_out_with_a_note_naming_it(tmp_path, ip, run, link):
    for rank in range(2):
        _small_rank(tmp_path / f"rank-{rank}.json", rank)
    target = tmp_path / "elsewhere" / "rank-2.json" if link == "dangling" else "rank-2.json"
    (tmp_path / "rank-2.json").symlink_to(target)
    why = (
        f"is a link to {target}, which does not exist"
        if link == "dangling"
        else "is a link that loops back on itself"
    )
    r = load_trace(tmp_path)
    assert r.ranks == [0, 1]
    assert r.notes[0] == f"rank-2.json {why}: it was left out"
    # as a user loads it
    shown = run_showing(ip, run, f"%gpuprofile --load {tmp_path}")
    assert shown.result.success
    assert f"rank-2.json {why}: it was left out" in shown.plain()
    # a folder of broken links alone says what it holds
    for rank in range(2):
        (tmp_path / f"rank-{rank}.json").unlink()
    with pytest.raises(TraceError, match=r"holds no trace files .*; rank-2\.json is a link"):
        load_trace(tmp_path)


def test_a_copy_of_a_rank_leaves_the_original_its_number_and_is_named(tmp_path):
    for rank in range(2):
        _small_rank(tmp_path / f"rank-{rank}.json", rank)
        _gz(tmp_path / f"rank-{rank}.json")
    # saved beside the original, and first in the directory's order
    (tmp_path / "rank-1-copy.json.gz").write_bytes((tmp_path / "rank-1.json.gz").read_bytes())
    r = load_trace(tmp_path)
    assert r.ranks == [0, 1, 2]
    files = [s.file.rsplit("/", 1)[-1] for s in r.rank_summaries]
    assert files == ["rank-0.json.gz", "rank-1.json.gz", "rank-1-copy.json.gz"]
    assert r.notes[0] == (
        "rank-1-copy.json.gz says it is rank 1, as rank-1.json.gz does: rank-1.json.gz is "
        "loaded as rank 1 and rank-1-copy.json.gz as rank 2 (a copy of it? leave it out of "
        "the folder)"
    )
    assert r.rank(1).source.endswith("/rank-1.json.gz")


def test_a_file_named_for_a_rank_another_holds_is_named():
    from gpumagic.profile.ranks import number_ranks, numbering_notes

    files = ["rank-0.json", "rank-1-copy.json", "rank-1.json", "x.json"]
    declared = [0, 1, 1, None]
    numbers = number_ranks(declared, files)
    assert numbers == [0, 2, 1, 3]
    notes = numbering_notes(declared, files, numbers)
    assert len(notes) == 1 and notes[0].startswith("rank-1-copy.json says it is rank 1")
    # undeclared: the name's number, said when another file holds it
    assert number_ranks([None, None], ["rank3.json", "rank-3.json"]) == [3, 1]
    assert numbering_notes([None, None], ["rank3.json", "rank-3.json"], [3, 1]) == [
        "rank-3.json is named as rank 3, as rank3.json does: rank3.json is loaded as rank 3 "
        "and rank-3.json as rank 1 (a copy of it? leave it out of the folder)"
    ]


class _LostWorkers(Executor):
    """An executor whose every task fails as a cluster's does when a node goes away."""

    def submit(self, fn, /, *args, **kwargs):
        done: Future = Future()
        done.set_exception(OSError("worker node lost"))
        return done


def test_an_executor_whose_tasks_fail_names_the_rank_file(tmp_path):
    for rank in range(2):
        _small_rank(tmp_path / f"rank-{rank}.json", rank)
    with pytest.raises(RuntimeError, match=r"rank-0\.json") as failed:
        load_trace(tmp_path, executor=_LostWorkers())
    assert type(failed.value) is _rank_task_error()
    assert str(failed.value) == (
        f"{tmp_path / 'rank-0.json'}: the task analysing this rank failed "
        "(OSError: worker node lost)"
    )
    assert isinstance(failed.value.__cause__, OSError)  # the cluster's own error, kept


def _rank_task_error():
    import gpumagic.profile

    return gpumagic.profile.RankTaskError  # where a script finds it, beside TraceError


@pytest.mark.parametrize("dur", [1e308, 1.7e308, 1e11])
def test_an_absurd_duration_ends_with_the_trace_and_is_named(tmp_path, ip, run, dur):
    for rank in range(2):
        _small_rank(tmp_path / f"rank-{rank}.json", rank, mm_us=dur if rank == 0 else 20.0)
    note = (
        f"rank-0.json: 1 event lasts longer than a day (aten::mm, written as {dur:.3g} µs), "
        "which no profiler records: it ends where the trace's other events end."
    )
    one = load_trace(tmp_path / "rank-0.json")
    assert one.notes == [note]
    assert one.summary.wall_time_us == 7000.0  # the other events' extent
    job = load_trace(tmp_path)
    assert note in job.notes
    for r in (one, job):  # every number of the report is finite: it renders
        assert "inf" not in r.to_text() and note in r.to_text()
    shown = run_showing(ip, run, f"%gpuprofile --load {tmp_path / 'rank-0.json'}")
    assert shown.result.success and note in shown.plain()
    assert "1 event lasts longer than a day (aten::mm, written as" in shown.html()
