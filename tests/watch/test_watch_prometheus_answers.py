"""What a job's watch does with answers no real Prometheus gives (issue 25 items 10 and 11).

The server at the URL is the test's own (``prometheus_fixtures.AnswerServer``, an
``http.server`` on 127.0.0.1): it answers as Prometheus's query API does, then as the test
tells it to, with a malformed success, or with an answer that never ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psutil
import pytest
from prometheus_fixtures import AnswerServer
from watch_helpers import wait_for

from gpumagic.monitor import PrometheusError, current, watch
from gpumagic.monitor.job import dcgm

MIB = 1 << 20


@pytest.fixture
def answers() -> Iterator[AnswerServer]:
    server = AnswerServer([f.name for f in dcgm.JOB_FIELDS])
    try:
        yield server
    finally:
        server.stop()


def _readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpumagic-prometheus" and t.is_alive()]


@pytest.mark.parametrize(
    "mode, what",
    [
        ("abc", "a value that is not a number: 'abc' for DCGM_FI_DEV_GPU_UTIL{"),
        ("object", "malformed result: Expected `array`, got `object` - at `$.data.result`"),
        ("numbers", "malformed result: Expected `str`, got `int` - at `$.data.result[0].metric"),
    ],
)
def test_a_malformed_answer_at_the_start_is_an_error_naming_the_url(answers, mode, what):
    answers.mode = mode
    with pytest.raises(PrometheusError) as err:
        watch(prometheus=answers.url)
    message = str(err.value)
    assert message.startswith(f"Prometheus at {answers.url} answered /api/v1/query with ")
    assert what in message
    assert current() is None


@pytest.mark.parametrize(
    "mode, what",
    [
        ("not-http", "gave a broken HTTP answer (BadStatusLine: "),
        ("cut", "broke off its answer after 10 of the 1,000 bytes it announced"),
    ],
)
def test_an_answer_that_is_not_http_names_the_url(answers, mode, what):
    answers.mode = mode
    with pytest.raises(PrometheusError) as err:
        watch(prometheus=answers.url)
    assert str(err.value).startswith(f"Prometheus at {answers.url} {what}")


def test_the_magic_says_so_and_keeps_the_running_watch(answers, run):
    from IPython.core.error import UsageError

    run("%gpuwatch -i 0.5")
    running = current()
    assert running is not None and running.running
    answers.mode = "abc"
    r = run(f"%gpuwatch --prometheus {answers.url}")
    assert isinstance(r.result.error_in_exec, UsageError)
    assert f"Prometheus at {answers.url}" in str(r.result.error_in_exec)
    assert "'abc'" in str(r.result.error_in_exec)
    assert current() is running and running.running
    run("%gpuwatch stop")


def test_bad_answers_after_good_ones_cost_their_samples_and_are_counted(answers):
    w = watch(prometheus=answers.url, interval=0.2)  # discovery, history, a first sample: good
    assert len(w.gpus) == 2 and w.sample_errors == 0
    answers.mode = "abc"
    assert wait_for(lambda: w.sample_errors >= 4, 10.0)
    assert w.running
    status = w.status()
    mine = [n for n in status.notes if n.startswith(f"Prometheus {answers.url}")]
    assert len(mine) == 1, status.notes  # one note with a count, not one per sample
    note = mine[0]
    assert "reads failed" in note and "failing at every sample since" in note
    assert f"Prometheus at {answers.url} answered /api/v1/query" in note and "'abc'" in note
    html = status._repr_mimebundle_()["text/html"]
    assert "failing at every sample since" in html

    seq = w.seq
    answers.mode = "numbers"
    assert wait_for(lambda: "metric" in (w.last_error or ""), 10.0)
    assert w.seq == seq  # a malformed answer never becomes a sample
    answers.mode = "good"
    assert wait_for(lambda: w.seq >= seq + 3, 10.0)  # the watch goes on
    result = w.stop()
    assert not w.running
    note = next(n for n in result.notes if n.startswith(f"Prometheus {answers.url}"))
    assert "reads failed" in note and "failing at every sample" not in note
    failed = w.health.reads[0].count
    assert failed == w.sample_errors and f"{failed} of " in note
    assert set(result.series["value"]) <= {50.0, 51.0}  # every value kept is one it sent


def test_an_endless_answer_stops_at_the_timeout_and_is_read_no_further(answers):
    answers.mode = "endless"  # 1 MiB every 50 ms, never finished
    t = time.monotonic()
    with pytest.raises(PrometheusError, match=f"Prometheus at {answers.url} did not answer within 1 s"):
        watch(prometheus=answers.url, timeout=1.0)
    assert time.monotonic() - t < 5.0
    # The reader stops and hangs up: it does not go on reading what the server sends.
    assert wait_for(lambda: not _readers() and answers.hangups >= 1, 5.0), _readers()
    rss = psutil.Process().memory_info().rss
    time.sleep(4.0)  # 80 MiB more would come in this time to a reader that reads on
    grew = (psutil.Process().memory_info().rss - rss) / MIB
    assert grew < 40, f"RSS grew {grew:.0f} MiB after the time-out"


@pytest.mark.parametrize("mode, said", [("huge", ""), ("announced", " (it announced 2,048 MiB)")])
def test_an_answer_larger_than_the_bound_is_refused(answers, mode, said):
    answers.mode = mode
    with pytest.raises(PrometheusError) as err:
        watch(prometheus=answers.url, timeout=20.0)
    assert str(err.value).startswith(
        f"Prometheus at {answers.url} sent an answer larger than 128 MiB{said}: stopped reading"
    )
    assert wait_for(lambda: not _readers(), 5.0)


def test_a_long_windows_history_is_spaced_to_a_bounded_answer():
    server = AnswerServer([f.name for f in dcgm.JOB_FIELDS], gpus=12)  # 108 series
    try:
        w = watch(prometheus=server.url, window=86_400, interval=5.0)
        w.stop()
    finally:
        server.stop()
    asked = server.ranges[0]
    points = (float(asked["end"]) - float(asked["start"])) / float(asked["step"]) + 1
    # Prometheus's own limit (10,000 points a series here) would be 1.08 million in all
    assert points >= 9_000 and points * 108 <= 1_001_000  # a million, to the step's ms
