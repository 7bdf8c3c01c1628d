"""``serve_metrics``: the endpoints, their server threads, and who stops the watcher.

``prometheus_client`` serves each endpoint (``pip install prometheus-client``). What two
calls give (issue 25 item 12): each ``serve_metrics`` call opens an endpoint of its own
(``port=0``: a free port each time), all of them serving the one running watcher; each
stops alone (``.stop()``), and every one stops with its watcher. A watcher that
``serve_metrics`` started itself (none was running) stops when the last endpoint serving it
stops, not before. Asking again for a port this kernel already serves the same watcher on
gives that endpoint back, so a notebook cell with ``serve_metrics(9401)`` can be run again.

An endpoint is bound before anything else is touched: a port that is taken or out of
range fails first, with the running watch untouched (``%gpuwatch --serve`` binds before it
starts the new watch, :func:`open_endpoint`).
"""

from __future__ import annotations

import socket
import threading
import weakref
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


def check_port(port: object) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer from 0 to 65535, got {port!r}")
    return port


class MetricsServer:
    """An endpoint: ``url`` to give Prometheus, ``stop()`` to close it (idempotent).

    Built by :func:`open_endpoint` (bound, serving nothing yet) and given its watcher by
    :meth:`serve`; :func:`serve_metrics` does both.
    """

    def __init__(self, port: int, host: str) -> None:
        client = _require_client()
        from prometheus_client import CollectorRegistry

        check_port(port)
        self.registry = CollectorRegistry(auto_describe=False)
        try:
            self._server, self._thread = client.start_http_server(
                port, addr=host, registry=self.registry
            )
        except OSError as exc:
            raise ValueError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
            ) from None
        self.host = host
        self.asked_port = port
        self.port = int(self._server.server_address[1])
        shown = socket.gethostname() if host in ("", "0.0.0.0", "::") else host
        self.url = f"http://{shown}:{self.port}/metrics"
        self.watcher: Watcher | None = None
        self._lock = threading.Lock()
        self.stopped = False
        self._unsubscribe: Any = None

    def serve(self, watcher: Watcher, started_here: bool = False) -> MetricsServer:
        """Serve ``watcher``'s samples (``started_here``: serve_metrics started it, so the
        last endpoint serving it stops it)."""
        check_servable(watcher)
        self.watcher = watcher
        self.registry.register(SnapshotCollector(watcher))
        with _lock:
            if started_here:
                _started.add(watcher)
            _servers.append(self)
        self._unsubscribe = watcher.subscribe(self._on_watch)
        return self

    def _on_watch(self, event: str) -> None:
        if event == "stop":
            self._close()

    def _close(self) -> None:
        with self._lock:
            if self.stopped:
                return
            self.stopped = True
        with _lock:
            if self in _servers:
                _servers.remove(self)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def stop(self) -> None:
        """Close the endpoint (and the watcher, when serve_metrics started it and no other
        endpoint serves it)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
        self._close()
        watcher = self.watcher
        if watcher is None:
            return
        with _lock:
            last = watcher in _started and not any(s.watcher is watcher for s in _servers)
            if last:
                _started.discard(watcher)
        if last:
            watcher.stop()

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "serving"
        return f"<gpumagic MetricsServer {state} {self.url}>"


# Every endpoint of this kernel that serves a watcher, and the watchers serve_metrics started.
_servers: list[MetricsServer] = []
_started: weakref.WeakSet[Watcher] = weakref.WeakSet()
_lock = threading.Lock()


def check_servable(watcher: Watcher) -> None:
    if watcher.stopped_at is not None:
        raise ValueError(
            "this watcher was stopped: serve the running one (the default) or start a new "
            "one with gpumagic.watch()"
        )
    if watcher.layout is not MACHINE:
        # The collector writes this machine's readings under DCGM's names; a job's are in
        # Prometheus already.
        raise ValueError(
            "serve_metrics serves this kernel's own samples; the watcher running reads a "
            f"job's from {watcher.origin or 'elsewhere'} already (stop it first: %gpuwatch stop)"
        )


def open_endpoint(port: int, host: str = "127.0.0.1") -> MetricsServer:
    """An endpoint bound at ``host:port`` that serves nothing until :meth:`MetricsServer.serve`:
    a taken port fails here, before any watch is touched."""
    _require_client()
    return MetricsServer(check_port(port), host)


def serve_metrics(
    port: int = 0, host: str = "127.0.0.1", watcher: Watcher | None = None
) -> MetricsServer:
    """Serve ``watcher``'s samples (default: the running ``%gpuwatch``; one is started when
    none runs) at ``http://host:port/metrics`` for Prometheus; returns the endpoint (``.url``,
    ``.stop()``). ``port=0`` picks a free port. ``host="0.0.0.0"`` lets other machines scrape
    it (the default, ``127.0.0.1``, only this one: the metrics name the cells you run).

    Each call opens an endpoint of its own on the same watcher, stopped alone by its
    ``.stop()``; all stop with their watcher; a watcher started here stops when the last of
    its endpoints stops. The same port asked again for the same watcher gives back the
    endpoint already serving it.
    """
    _require_client()
    check_port(port)
    target = watcher if watcher is not None else current()
    if target is not None:
        check_servable(target)
        with _lock:
            again = next(
                (
                    s
                    for s in _servers
                    if port and (s.host, s.asked_port) == (host, port) and s.watcher is target
                ),
                None,
            )
        if again is not None and not again.stopped:
            return again
    endpoint = MetricsServer(port, host)  # bound before a watcher is started
    started_here = target is None
    try:
        if target is None:
            target = Watcher().start()
        return endpoint.serve(target, started_here)
    except BaseException:
        endpoint.stop()
        if started_here and target is not None:
            target.stop()
        raise


def servers() -> list[MetricsServer]:
    """This kernel's endpoints that serve a watcher now."""
    with _lock:
        return list(_servers)


def stop_serving() -> None:
    """Close every endpoint (``%unload_ext`` and the kernel's exit)."""
    for server in servers():
        server.stop()
