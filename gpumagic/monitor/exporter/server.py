"""``serve_metrics``: the endpoint, its server thread, and the one endpoint per kernel.

``prometheus_client`` serves it (``pip install prometheus-client``); the endpoint stops
with its watcher, and serving again closes the previous one.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

from gpumagic.monitor.exporter.collector import SnapshotCollector
from gpumagic.monitor.machine import MACHINE
from gpumagic.monitor.watcher import Watcher, current


def _require_client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ImportError(
            "serve_metrics needs prometheus-client: pip install prometheus-client "
            "(or pip install 'gpumagic[cluster]')"
        ) from None
    return prometheus_client


class MetricsServer:
    """A running endpoint: ``url`` to give Prometheus, ``stop()`` to close it (idempotent)."""

    def __init__(self, watcher: Watcher, port: int, host: str, own_watcher: bool) -> None:
        client = _require_client()
        from prometheus_client import CollectorRegistry

        self.watcher = watcher
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(watcher))
        try:
            self._server, self._thread = client.start_http_server(
                port, addr=host, registry=self.registry
            )
        except OSError as exc:
            raise ValueError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
            ) from None
        self.host = host
        self.port = int(self._server.server_address[1])
        shown = socket.gethostname() if host in ("", "0.0.0.0", "::") else host
        self.url = f"http://{shown}:{self.port}/metrics"
        self._own_watcher = own_watcher
        self._lock = threading.Lock()
        self.stopped = False
        self._unsubscribe = watcher.subscribe(self._on_watch)

    def _on_watch(self, event: str) -> None:
        if event == "stop":
            self._close()

    def _close(self) -> None:
        with self._lock:
            if self.stopped:
                return
            self.stopped = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def stop(self) -> None:
        """Close the endpoint (and the watcher, when serve_metrics started it)."""
        self._unsubscribe()
        self._close()
        if self._own_watcher:
            self.watcher.stop()

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "serving"
        return f"<gpumagic MetricsServer {state} {self.url}>"


_current: MetricsServer | None = None
_current_lock = threading.Lock()


def serve_metrics(
    port: int = 0, host: str = "127.0.0.1", watcher: Watcher | None = None
) -> MetricsServer:
    """Serve ``watcher``'s samples (default: the running ``%gpuwatch``; one is started when
    none runs) at ``http://host:port/metrics`` for Prometheus; returns the server (``.url``,
    ``.stop()``). ``port=0`` picks a free port. ``host="0.0.0.0"`` lets other machines scrape
    it (the default, ``127.0.0.1``, only this one: the metrics name the cells you run). One
    endpoint per kernel: serving again closes the previous one. It stops with its watcher.
    """
    global _current
    _require_client()
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer from 0 to 65535, got {port!r}")
    own = False
    if watcher is None:
        watcher = current()
        if watcher is None:
            watcher, own = Watcher().start(), True
    if watcher.layout is not MACHINE:
        # The collector writes this machine's readings under DCGM's names; a job's are in
        # Prometheus already.
        raise ValueError(
            "serve_metrics serves this kernel's own samples; the watcher running reads a "
            f"job's from {watcher.origin or 'elsewhere'} already (stop it first: %gpuwatch stop)"
        )
    with _current_lock:
        previous, _current = _current, None
    if previous is not None:
        previous.stop()
    try:
        server = MetricsServer(watcher, port, host, own)
    except BaseException:
        if own:
            watcher.stop()
        raise
    with _current_lock:
        _current = server
    return server


def current_server() -> MetricsServer | None:
    return _current


def stop_serving() -> None:
    """Close the endpoint, if any (``%unload_ext`` and the kernel's exit)."""
    global _current
    with _current_lock:
        server, _current = _current, None
    if server is not None:
        server.stop()
