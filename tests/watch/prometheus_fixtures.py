"""A real Prometheus for the tests, and recorded dcgm-exporter pages served as the exporter serves them.

``PrometheusServer`` runs Debian's ``prometheus`` binary on 127.0.0.1 with a generated
config (1 s scrapes), a temporary data directory and a free port. ``ExporterDouble`` serves
one of the pages in ``dcgm/`` at ``/metrics``, its values moving at every scrape as the
README there describes, and logs every value it served. Tests only.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DCGM_PAGES = Path(__file__).parent / "dcgm"
PROMETHEUS = shutil.which("prometheus") or (
    "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None
)
NO_PROMETHEUS = (
    "Debian's prometheus package is not installed (apt-get install prometheus; .ci/run does): "
    "these tests run a real Prometheus server"
)
SCRAPE_S = 1.0

_LINE = re.compile(r"^(\w+)\{(.*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
# what moves at each scrape, per GPU phase -1, 0, +1 (see dcgm/README.md)
_STEP = {
    "DCGM_FI_DEV_GPU_UTIL": 3.0,
    "DCGM_FI_DEV_POWER_USAGE": 10.0,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.02,
}
_FLOATS = {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"}
_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ExporterDouble:
    """One node's dcgm-exporter: the recorded page at ``/metrics``, values moving per scrape."""

    def __init__(self, page: Path) -> None:
        self.lines: list[tuple[str, str, dict[str, str], str] | str] = []
        for line in page.read_text().splitlines():
            m = _LINE.match(line)
            if m:
                labels = dict(_LABEL.findall(m.group(2)))
                self.lines.append((m.group(1), m.group(2), labels, m.group(3)))
            else:
                self.lines.append(line)
        self.host = next(x[2]["Hostname"] for x in self.lines if isinstance(x, tuple))
        self.served: list[tuple[float, str, str, str, float]] = []  # t, host, gpu, metric, value
        # (gpu, metric) -> the text to serve instead: a DCGM blank, say
        self.override: dict[tuple[str, str], str] = {}
        self.scrapes = 0
        self._energy: dict[str, float] = {}
        self._last: float | None = None
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def page(self) -> str:
        with self._lock:
            now = time.time()
            dt = 0.0 if self._last is None else now - self._last
            self._last = now
            power: dict[str, float] = {}
            out = []
            for item in self.lines:
                if isinstance(item, str):
                    out.append(item)
                    continue
                name, labels_text, labels, value = item
                gpu = labels["gpu"]
                phase = (self.scrapes + int(gpu)) % 3 - 1
                v = float(value)
                if name in _STEP:
                    v += _STEP[name] * phase
                    if name == "DCGM_FI_DEV_GPU_UTIL":
                        v = min(max(v, 0.0), 100.0)
                text = f"{v:f}" if name in _FLOATS else f"{round(v):d}"
                if name == "DCGM_FI_DEV_POWER_USAGE":
                    power[gpu] = float(text)
                out.append((name, labels_text, gpu, text))
            # the energy counter advances by the power served times the time since the last scrape
            lines = []
            for item in out:
                if isinstance(item, str):
                    lines.append(item)
                    continue
                name, labels_text, gpu, text = item
                if name == _ENERGY:
                    base = self._energy.get(gpu, float(text))
                    self._energy[gpu] = base + power.get(gpu, 0.0) * dt * 1000.0
                    text = f"{round(self._energy[gpu]):d}"
                text = self.override.get((gpu, name), text)
                self.served.append((now, self.host, gpu, name, float(text)))
                lines.append(f"{name}{{{labels_text}}} {text}")
            self.scrapes += 1
            return "\n".join(lines) + "\n"

    def served_values(self, metric: str, gpu: str) -> set[float]:
        with self._lock:
            return {v for _, h, g, m, v in self.served if m == metric and g == gpu}

    def start(self) -> int:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = double.page().encode()
                self.send_response(200)
                # what promhttp (and so dcgm-exporter) answers for the text format
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the scraper gave up (Prometheus stopping): as an exporter shrugs it off

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True, name="dcgm-double").start()
        return int(self._server.server_address[1])

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class PrometheusServer:
    """``prometheus`` on 127.0.0.1 with a generated config: ``jobs`` maps job names to targets."""

    def __init__(self, jobs: dict[str, list[str]], directory: Path) -> None:
        assert PROMETHEUS is not None, NO_PROMETHEUS
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.directory = directory
        config = [
            "global:",
            f"  scrape_interval: {SCRAPE_S:g}s",
            f"  scrape_timeout: {SCRAPE_S:g}s",
            f"  evaluation_interval: {SCRAPE_S:g}s",
            "scrape_configs:" if jobs else "scrape_configs: []",
        ]
        for job, targets in jobs.items():
            config += [
                f"  - job_name: {job}",
                "    static_configs:",
                f"      - targets: [{', '.join(repr(t) for t in targets)}]",
            ]
        (directory / "prometheus.yml").write_text("\n".join(config) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> PrometheusServer:
        log = (self.directory / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={self.directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        if not wait_for(self._ready, timeout):
            self.stop()
            raise RuntimeError(
                f"prometheus did not become ready in {timeout:g} s:\n"
                + (self.directory / "prometheus.log").read_text()[-2000:]
            )
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())["data"]["result"]

    def wait_until(
        self, expr: str, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 20.0
    ) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []

        def check() -> bool:
            nonlocal found
            found = self.query(expr)
            return predicate(found)

        if not wait_for(check, timeout, pause=0.2):
            raise AssertionError(f"{expr} never satisfied the test within {timeout:g} s: {found}")
        return found

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_for(predicate: Callable[[], bool], timeout: float, pause: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(pause)
    return predicate()


# -- a server at a Prometheus URL that answers what a test tells it to -------------------
_GOOD_LABELS = {"Hostname": "node-a", "UUID": "GPU-0a", "modelName": "NVIDIA H100 80GB HBM3"}
MIB_BLOCK = b" " * (1 << 20)


def _good(path: str, names: list[str], gpus: int) -> dict[str, Any]:
    now = time.time()
    result: list[dict[str, Any]] = []
    for gpu in map(str, range(gpus)):
        for name in names:
            metric = {"__name__": name, **_GOOD_LABELS, "gpu": gpu}
            if path.endswith("query_range"):
                result.append({"metric": metric, "values": [[now - 2, "50"], [now - 1, "51"]]})
            else:
                result.append({"metric": metric, "value": [now, "50"]})
    kind = "matrix" if path.endswith("query_range") else "vector"
    return {"status": "success", "data": {"resultType": kind, "result": result}}


def _bad(mode: str) -> dict[str, Any]:
    labels = {"__name__": "DCGM_FI_DEV_GPU_UTIL", **_GOOD_LABELS, "gpu": "0"}
    result: Any = [{"metric": labels, "value": [time.time(), "50"]}]
    if mode == "abc":
        result[0]["value"][1] = "abc"
    elif mode == "object":
        result = {"metric": labels}
    elif mode == "numbers":
        result[0]["metric"] = {**labels, "gpu": 0, "Hostname": 7}
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


class AnswerServer:
    """An HTTP server on 127.0.0.1 that answers Prometheus's query API as ``mode`` says:
    ``good`` (two GPUs' DCGM series), a malformed success (``abc``, ``object``, ``numbers``),
    ``endless`` (1 MiB every 50 ms, never finished), ``huge`` (129 MiB of JSON, then the
    end), ``announced`` (a Content-Length of 2 GiB, then nothing), ``cut`` (an answer that
    stops short of its length) or ``not-http`` (a line that is not HTTP). ``hangups`` counts the
    answers whose reader went away before the end."""

    def __init__(self, names: list[str], gpus: int = 2) -> None:
        self.names = names
        self.gpus = gpus
        self.mode = "good"
        self.ranges: list[dict[str, str]] = []  # the query_range requests' parameters
        self.requests = 0
        self.hangups = 0
        self._stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests += 1
                parts = urllib.parse.urlsplit(self.path)
                path = parts.path
                if path.endswith("query_range"):
                    server.ranges.append(dict(urllib.parse.parse_qsl(parts.query)))
                try:
                    server._answer(self, path)
                except OSError:  # the client closed the connection
                    server.hangups += 1

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True, name="answers").start()

    def _answer(self, handler: BaseHTTPRequestHandler, path: str) -> None:
        mode = self.mode
        if mode in ("good", "abc", "object", "numbers"):
            doc = _good(path, self.names, self.gpus) if mode == "good" else _bad(mode)
            body = json.dumps(doc).encode()
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
            return
        if mode == "not-http":
            handler.wfile.write(b"HELLO THERE\r\n\r\n")
            return
        if mode == "cut":  # promises 1000 bytes, sends 10, hangs up
            handler.send_response(200)
            handler.send_header("Content-Length", "1000")
            handler.end_headers()
            handler.wfile.write(b'{"status":')
            return
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        if mode == "announced":
            handler.send_header("Content-Length", str(2 << 30))
        handler.end_headers()
        handler.wfile.write(b'{"status":"success","data":{"resultType":"vector","result":[')
        handler.wfile.flush()
        sent = 0
        while not self._stop.is_set():
            if mode == "announced":
                self._stop.wait(0.05)
                continue
            handler.wfile.write(MIB_BLOCK)
            sent += 1
            if mode == "huge" and sent == 129:
                handler.wfile.write(b"]}}")
                return
            if mode == "endless":
                time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
