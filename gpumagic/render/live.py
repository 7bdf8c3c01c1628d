"""A display slot refreshed from a background thread while a cell runs.

Shared by ``%%memtrace`` (statement running now + memory so far), ``%%gpuprofile``
(elapsed, steps so far) and ``%gpuwatch`` (the live chart). The caller supplies a
``render()`` callback that builds HTML from data it already has; the view calls it
at most once per ``interval`` seconds on its own thread and pushes the result only
when it changed, so a live view never asks the device for anything.

A measured run (``%%memtrace``, ``%%gpuprofile``) is shown through :class:`LiveResult`, the
:class:`gpumagic.cell.Presenter` that opens the view once the run started and puts the
result in its place when the run is over.

Front ends (:func:`detect_mode`):

* JupyterLab and Notebook 7 with ipywidgets: an ``ipywidgets.HTML`` (widget comm messages
  flow while the kernel is busy running the cell).
* VS Code's Jupyter extension: an output updated in place through a display handle. Its
  widget renderer shows nothing for ipywidgets 8.1.9, the version pip resolves today
  (vscode-jupyter#17504), so a widget would stay blank until the final output replaced it.
  Found by its kernel messages (``username: "vscode"`` in their header) or the
  ``VSCODE_PID``/``VSCODE_CWD`` variables VS Code passes to the kernels it starts.
* Colab: display updates too; its widget manager drops updates sent from other threads
  (colabtools#3373).
* A kernel without ipywidgets: display updates.
* A terminal (IPython without a notebook front end): nothing live, since printing a frame
  a second would bury the cell's own output; the magic's final output is printed.

``GPUMAGIC_LIVE=widget|display|off`` overrides the choice. Every frame and final output is
HTML that survives a sanitiser (inline styles, charts as images), since display updates
are saved with the notebook.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

_MODES = ("widget", "display", "off")
R = TypeVar("R")


def detect_mode() -> str:
    """Which live front end this process can drive: ``widget``, ``display`` or ``off``."""
    forced = os.environ.get("GPUMAGIC_LIVE", "").strip().lower()
    if forced in _MODES:
        return forced
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency
        return "off"
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return "off"  # terminal IPython or a plain InteractiveShell: no rich front end
    if "google.colab" in sys.modules:
        return "display"  # Colab's widget manager drops updates sent from other threads
    if in_vscode(shell):
        return "display"  # VS Code renders no ipywidgets 8.1.9 widget (vscode-jupyter#17504)
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return "display"
    return "widget"


def in_vscode(shell: Any) -> bool:
    """Whether VS Code's Jupyter extension drives this kernel: its requests say
    ``username: "vscode"`` in their header (a remote kernel included), and the kernels it
    starts inherit ``VSCODE_PID``/``VSCODE_CWD``."""
    if os.environ.get("VSCODE_PID") or os.environ.get("VSCODE_CWD"):
        return True
    parent = getattr(shell, "parent_header", None)
    header = parent.get("header", {}) if isinstance(parent, dict) else {}
    return isinstance(header, dict) and header.get("username") == "vscode"


class LiveView:
    """A throttled, thread-driven display slot; ``start()`` and ``finish()`` run on the main thread."""

    def __init__(
        self,
        render: Callable[[], str | None],
        *,
        delay: float = 1.0,
        interval: float = 1.0,
        mode: str | None = None,
        name: str = "gpumagic-live",
    ) -> None:
        self._render = render
        self.delay = delay
        self.interval = max(interval, 0.05)
        self.mode = mode or detect_mode()
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._widget: Any = None
        self._handle: Any = None
        self._last_html: str | None = None
        self.pushes = 0  # frames actually sent to the front end (tests read this)
        self.error: BaseException | None = None  # last error of render(), never raised into cells

    # -- main thread -------------------------------------------------------------------------
    def start(self) -> LiveView:
        if self.mode == "off":
            return self
        from IPython.display import display

        if self.mode == "widget":
            import ipywidgets

            self._widget = ipywidgets.HTML(value="")
            self._handle = display(self._widget, display_id=True)
        else:
            # An empty placeholder that the thread fills in place via update_display_data.
            self._handle = display({"text/plain": ""}, raw=True, display_id=True)
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (no more frames; :attr:`pushes` is final); the slot stays."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

    def finish(self, final: Any = None, display_if_off: bool = False) -> None:
        """Stop the thread, then put ``final`` (an object with a mime bundle, or None) in the slot.

        ``display_if_off``: when there was no live slot (a terminal, ``mode="off"``), display
        ``final`` as an ordinary output instead, so a magic ends the same way in every front end.
        """
        self.stop()
        if self._handle is None:
            if display_if_off and final is not None:
                from IPython.display import display

                display(final)
            return
        if final is not None:
            self._handle.update(final)
        else:
            self._handle.update({"text/plain": ""}, raw=True)
        if self._widget is not None:
            self._widget.close()
            self._widget = None
        self._handle = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- any thread --------------------------------------------------------------------------
    def refresh(self) -> None:
        """Render now and push if changed (the thread calls this; tests may too)."""
        try:
            html = self._render()
        except Exception as exc:  # a live view must never break the cell it watches
            self.error = exc
            return
        if html is None or html == self._last_html:
            return
        self._last_html = html
        try:
            if self._widget is not None:
                self._widget.value = html
            elif self._handle is not None:
                self._handle.update({"text/html": html, "text/plain": ""}, raw=True)
            self.pushes += 1
        except Exception as exc:  # front end gone (kernel shutting down): stop quietly
            self.error = exc
            self._stop.set()

    def _run(self) -> None:
        if self._stop.wait(self.delay):
            return
        while not self._stop.is_set():
            started = time.monotonic()
            self.refresh()
            self._stop.wait(max(self.interval - (time.monotonic() - started), 0.05))


class LiveResult(Generic[R]):
    """The front end of a measured run (:class:`gpumagic.cell.Presenter`): ``view`` while the
    cell runs, then in its place what ``present(result)`` returns (an object with a mime
    bundle; None shows nothing).

    ``present`` runs once the view's thread has stopped, so it may read ``view.pushes``;
    whatever it does, the view is finished (its thread is never left running).
    """

    def __init__(self, view: LiveView, present: Callable[[R | None], Any]) -> None:
        self.view = view
        self._present = present

    def start(self) -> LiveView:
        return self.view.start()

    def show(self, result: R | None) -> None:
        final = None
        try:
            self.view.stop()
            final = self._present(result)
        finally:
            self.view.finish(final, display_if_off=True)


@contextlib.contextmanager
def kept_off_screen() -> Iterator[list[int]]:
    """What code displays while this lasts (``display()``, a progress widget: a dry run's
    cell) is captured, and the matplotlib figures it makes are closed (the inline backend
    would show them when the cell ends); the list gets how many outputs there were."""
    from IPython.utils.capture import capture_output

    pyplot = sys.modules.get("matplotlib.pyplot")
    before = set(pyplot.get_fignums()) if pyplot is not None else set()
    shown: list[int] = []
    with capture_output(stdout=False, stderr=False, display=True) as cap:
        try:
            yield shown
        finally:
            made: list[int] = []
            pyplot = sys.modules.get("matplotlib.pyplot")
            if pyplot is not None:
                made = [n for n in pyplot.get_fignums() if n not in before]
                for number in made:
                    pyplot.close(number)
            if cap.outputs or made:
                shown.append(len(cap.outputs) + len(made))
