"""What each front end gets: the live view's kind (widget, display updates, nothing live),
``%gpuwatch`` confirming itself in a terminal, and results that read well wherever they are
printed (a one-line ``repr``, the whole report as ``str``, ``_repr_html_``)."""

from __future__ import annotations

import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from gpumagic.render import live


class _KernelShell:
    """A stand-in for ipykernel's shell: what detect_mode reads (a kernel, the header of the
    request being run)."""

    def __init__(self, username: str = "") -> None:
        self.kernel = object()
        self.parent_header = {"header": {"username": username, "msg_type": "execute_request"}}


@pytest.fixture
def front_end(monkeypatch: pytest.MonkeyPatch):
    """Set the shell detect_mode finds; no GPUMAGIC_LIVE, no VS Code variables unless asked."""
    import IPython

    for name in ("GPUMAGIC_LIVE", "VSCODE_PID", "VSCODE_CWD"):
        monkeypatch.delenv(name, raising=False)

    def use(shell: Any) -> None:
        monkeypatch.setattr(IPython, "get_ipython", lambda: shell)

    return use


def test_jupyterlab_and_notebook_get_the_widget(front_end) -> None:
    front_end(_KernelShell(username="someone"))
    assert live.detect_mode() == "widget"


def test_vscode_gets_display_updates_found_by_its_requests(front_end) -> None:
    # vscode-jupyter sends its requests with username "vscode" (a remote kernel included)
    front_end(_KernelShell(username="vscode"))
    assert live.detect_mode() == "display"


@pytest.mark.parametrize("variable", ["VSCODE_PID", "VSCODE_CWD"])
def test_vscode_gets_display_updates_found_by_its_environment(front_end, monkeypatch, variable) -> None:
    front_end(_KernelShell())
    monkeypatch.setenv(variable, "12345")
    assert live.detect_mode() == "display"


def test_colab_gets_display_updates(front_end, monkeypatch) -> None:
    front_end(_KernelShell())
    monkeypatch.setitem(sys.modules, "google.colab", SimpleNamespace())
    assert live.detect_mode() == "display"


def test_a_terminal_gets_nothing_live(front_end) -> None:
    front_end(SimpleNamespace())  # an InteractiveShell: no kernel attribute
    assert live.detect_mode() == "off"
    front_end(None)
    assert live.detect_mode() == "off"


@pytest.mark.parametrize("forced", ["widget", "display", "off"])
def test_gpumagic_live_overrides(front_end, monkeypatch, forced) -> None:
    front_end(_KernelShell(username="vscode"))
    monkeypatch.setenv("GPUMAGIC_LIVE", forced)
    assert live.detect_mode() == forced


# -- %gpuwatch in a terminal ---------------------------------------------------------------------
def _watchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpumagic-watch" and t.is_alive()]


def test_gpuwatch_in_a_terminal_says_it_started_and_what_a_second_start_did(ip, run) -> None:
    from gpumagic.monitor import WatchResult

    try:
        r = run("%gpuwatch -i 0.2")
        assert r.result.success and r.result.result is None
        first = r.bundles[0]["text/plain"]
        assert first.startswith("%gpuwatch started: every 200 ms, watching host CPU and RAM")
        assert "%gpuwatch stop" in first and "replaced" not in first
        ip.user_ns.pop("_gpuwatch", None)
        r = run("%gpuwatch -i 0.3")
        second = r.bundles[0]["text/plain"]
        assert second.startswith("%gpuwatch started: every 300 ms")
        assert "replaced the watch started at" in second and "its result is in _gpuwatch" in second
        assert isinstance(ip.user_ns["_gpuwatch"], WatchResult)  # the first one's, not lost
        assert len(_watchers()) == 1
    finally:
        run("%gpuwatch stop")
    assert _watchers() == []


def test_started_note_in_a_notebook_speaks_only_of_a_replaced_watch() -> None:
    from gpumagic.monitor import Watcher
    from gpumagic.render.watch_live import started_note

    first = Watcher(interval=0.5, cells=False).start()
    second = Watcher(interval=0.5, cells=False).start()  # replaces the first
    try:
        assert started_note(first, None, live=True) is None  # the live chart says it started
        note = started_note(second, first, live=True)
        assert note is not None and "replaced the watch started at" in str(note)
    finally:
        second.stop()


# -- results -------------------------------------------------------------------------------------
def test_results_repr_in_one_line_and_str_in_full(ip, run) -> None:
    a = run("%%memtrace -q -o\nx = [0] * 100_000\n").result.result
    b = run("%%memtrace -q -o\ny = [1] * 10\n").result.result
    both = repr([a, b])
    assert "\n" not in both and both.count(f"<MemTrace: %%memtrace {a.device.label}: 1 statements") == 2
    assert "peak" in repr(a) and "net" in repr(a)
    assert str(a) == a._repr_mimebundle_()["text/plain"] and str(a).count("\n") >= 3
    assert a._repr_html_() == a._repr_mimebundle_()["text/html"]
    assert a._repr_html_().startswith('<div class="gpumagic gpumagic-memtrace">')


def test_every_result_kind_has_a_short_repr(ip, run) -> None:
    from gpumagic.environment import env

    report = env()
    assert "\n" not in repr(report) and repr(report).startswith("<EnvReport: ")
    assert len(str(report).splitlines()) > 5 and report._repr_html_()
    try:
        run("%gpuwatch -i 0.1")
        run("import time; time.sleep(0.25)")
        status = run("%gpuwatch status").result.result
        result = run("%gpuwatch stop").result.result
    finally:
        run("%gpuwatch stop")
    for watch_result, name in ((status, "WatchStatus"), (result, "WatchResult")):
        text = repr(watch_result)
        assert "\n" not in text and text.startswith(f"<{name}: gpuwatch")
        assert str(watch_result) == watch_result._repr_mimebundle_()["text/plain"]
        assert "data:image/svg+xml" in watch_result._repr_html_() or name == "WatchStatus"
