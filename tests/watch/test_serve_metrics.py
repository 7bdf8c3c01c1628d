"""``serve_metrics`` called more than once, and ``%gpuwatch --serve`` checked before it acts
(issue 25 item 12). The endpoints are real (``prometheus_client`` on 127.0.0.1), read with
urllib; Prometheus scraping them is in test_watch_prometheus.py.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_fixtures import free_port

from gpumagic.monitor import current, serve_metrics, watch
from gpumagic.monitor.exporter.server import servers, stop_serving


@pytest.fixture(autouse=True)
def no_endpoint_left() -> Iterator[None]:
    yield
    stop_serving()
    assert servers() == []


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as page:
            return b"gpumagic_watch_samples" in page.read()
    except urllib.error.URLError:
        return False


def test_two_calls_give_two_endpoints_on_one_watcher_each_stopped_alone():
    s1 = serve_metrics(0)  # no watch runs: it starts one
    s2 = serve_metrics(0)
    assert s1 is not s2 and s1.port != s2.port
    assert s1.watcher is s2.watcher is current() and current().running
    assert _answers(s1.url) and _answers(s2.url)
    s1.stop()
    assert not _answers(s1.url) and _answers(s2.url)
    assert s2.watcher.running  # the watcher stops when nobody serves it, not before
    s2.stop()
    assert not _answers(s2.url)
    assert not s2.watcher.running and current() is None


def test_the_same_port_again_gives_the_endpoint_back():
    port = free_port()
    s1 = serve_metrics(port)
    s2 = serve_metrics(port)  # a notebook cell run again
    assert s2 is s1 and _answers(s1.url)
    s1.stop()
    assert current() is None


def test_endpoints_stop_with_a_watch_of_the_users_and_never_stop_it():
    w = watch(interval=0.2, cells=False)
    s1, s2 = serve_metrics(0), serve_metrics(0)
    s1.stop()
    s2.stop()
    assert w.running and current() is w
    s3 = serve_metrics(0)
    w.stop()
    assert s3.stopped and not _answers(s3.url)
    with pytest.raises(ValueError, match="this watcher was stopped"):
        serve_metrics(0, watcher=w)


def test_gpuwatch_serve_checks_the_port_before_touching_the_watch(run, ip):
    from IPython.core.error import UsageError

    run("%gpuwatch -i 0.3")
    running = current()
    assert running is not None and running.running
    ip.user_ns.pop("_gpuwatch", None)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        for line, expected in [
            ("%gpuwatch -i 0.3 --serve 127.0.0.1:99999", "a port is a number from 0 to 65535"),
            ("%gpuwatch -i 0.3 --serve 127.0.0.1:-1", "a port is a number from 0 to 65535"),
            (
                f"%gpuwatch -i 0.3 --serve 127.0.0.1:{taken.getsockname()[1]}",
                f"cannot serve metrics on 127.0.0.1:{taken.getsockname()[1]}",
            ),
        ]:
            r = run(line)
            assert isinstance(r.result.error_in_exec, UsageError), line
            # nothing was touched: the same watch runs, no result was handed out
            assert current() is running and running.running, line
            assert "_gpuwatch" not in ip.user_ns and servers() == []
            assert expected in str(r.result.error_in_exec), str(r.result.error_in_exec)
    finally:
        taken.close()
    port = free_port()
    r = run(f"%gpuwatch -i 0.3 --serve {port}")
    assert r.result.success, r.result.error_in_exec
    assert current() is not running and not running.running
    assert _answers(f"http://127.0.0.1:{port}/metrics")
    run("%gpuwatch stop")
    assert servers() == []
