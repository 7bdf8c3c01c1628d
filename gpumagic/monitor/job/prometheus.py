"""A small client for Prometheus's HTTP API (``/api/v1/query``, ``/api/v1/query_range``).

Standard library only (``urllib``): the job view needs two endpoints and a JSON decoder.
Every call has a hard deadline: the socket timeout bounds connecting and each read, but
not a name lookup (``getaddrinfo`` ignores it, and a dead resolver can hold it for tens of
seconds), so the request runs on a daemon thread that is abandoned once the deadline
passes. Whatever goes wrong becomes a :class:`PrometheusError` (a ``ValueError``) whose
message names the URL, and the query where Prometheus rejected one.
"""

from __future__ import annotations

import json
import math
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_TIMEOUT_S = 3.0


class PrometheusError(ValueError):
    """Prometheus could not be asked, or refused: the message names the URL (and query)."""


@dataclass
class Series:
    """One time series of a query's result: its labels and its samples (seconds, values)."""

    labels: dict[str, str]
    times: np.ndarray
    values: np.ndarray

    @property
    def name(self) -> str:
        return self.labels.get("__name__", "")


def normalize_url(url: str) -> str:
    """``host:9090`` or ``http://host:9090/`` -> ``http://host:9090`` (no trailing slash)."""
    text = str(url).strip()
    if not text:
        raise PrometheusError("the Prometheus URL is empty (give one like http://prometheus:9090)")
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PrometheusError(
            f"{url!r} is not a Prometheus URL (give one like http://prometheus:9090)"
        )
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def normalize_selector(selector: str | None) -> str:
    """PromQL label matchers without braces: ``{job="dcgm"}`` and ``job="dcgm"`` are the same."""
    if selector is None:
        return ""
    text = str(selector).strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    return text


def selector_expr(names: list[str] | tuple[str, ...], selector: str) -> str:
    """``{__name__=~"A|B", <selector>}``: every named metric the selector matches, in one query."""
    matcher = f'__name__=~"{"|".join(names)}"'
    return "{" + matcher + (f", {selector}" if selector else "") + "}"


class PrometheusClient:
    """Asks one Prometheus server; every call returns within ``timeout`` seconds or raises."""

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = normalize_url(url)
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise PrometheusError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.timeout = float(timeout)

    def query(self, expr: str, at: float | None = None) -> list[Series]:
        """An instant query (``/api/v1/query``), evaluated at ``at`` (default: the server's now)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return _series(self._get("/api/v1/query", params, expr))

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        """A range query (``/api/v1/query_range``): the expression at ``start + k * step``."""
        params = {
            "query": expr,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": f"{max(step, 0.001):.3f}",
        }
        return _series(self._get("/api/v1/query_range", params, expr))

    def _get(self, path: str, params: dict[str, str], expr: str) -> Any:
        # Prometheus stops evaluating a query past its own timeout too (then says so).
        params = {**params, "timeout": f"{self.timeout:g}s"}
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        box: dict[str, Any] = {}

        def fetch() -> None:
            try:
                box["body"] = self._fetch(url, expr)
            except BaseException as exc:  # handed to the caller's thread
                box["error"] = exc

        thread = threading.Thread(target=fetch, name="gpumagic-prometheus", daemon=True)
        thread.start()
        thread.join(self.timeout + 0.5)
        if thread.is_alive():
            raise PrometheusError(
                f"Prometheus at {self.url} did not answer within {self.timeout:g} s"
            )
        if "error" in box:
            raise box["error"]
        return box["body"]

    def _fetch(self, url: str, expr: str) -> Any:
        # imported here: urllib.request pulls in http.client, email and ssl (a few tens of ms)
        # that `import gpumagic` should not pay for
        import urllib.error
        import urllib.request

        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            # a rejected query comes back as 400/422 with Prometheus's JSON explanation
            raw = exc.read() or b""
            doc = _json(raw)
            if isinstance(doc, dict) and doc.get("status") == "error":
                raise PrometheusError(_refused(self.url, expr, doc)) from None
            raise PrometheusError(
                f"Prometheus at {self.url} answered HTTP {exc.code} {exc.reason}"
                + (" (is this the Prometheus server's URL?)" if exc.code == 404 else "")
            ) from None
        except urllib.error.URLError as exc:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {exc.reason}") from None
        except TimeoutError:
            raise PrometheusError(
                f"Prometheus at {self.url} did not answer within {self.timeout:g} s"
            ) from None
        except OSError as exc:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {exc}") from None
        doc = _json(raw)
        if not isinstance(doc, dict) or "status" not in doc:
            raise PrometheusError(
                f"{self.url} did not answer as Prometheus's HTTP API does (no JSON status): "
                "is this the Prometheus server's URL?"
            )
        if doc["status"] != "success":
            raise PrometheusError(_refused(self.url, expr, doc))
        return doc.get("data", {})

    def __repr__(self) -> str:
        return f"<PrometheusClient {self.url}>"


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _refused(url: str, expr: str, doc: dict[str, Any]) -> str:
    kind = doc.get("errorType", "error")
    return f"Prometheus at {url} refused the query {expr}: {kind}: {doc.get('error', '')}"


def _series(data: Any) -> list[Series]:
    """The result of a query as Series: a vector gives one sample per series, a matrix many;
    a scalar or string result gives none (the job view never asks for one)."""
    kind = data.get("resultType") if isinstance(data, dict) else None
    out: list[Series] = []
    for item in data.get("result", []) if kind in ("vector", "matrix") else []:
        pairs = [item["value"]] if kind == "vector" else item.get("values", [])
        # Prometheus writes values as strings ("NaN", "+Inf" included): float() reads them all
        times = np.array([float(t) for t, _ in pairs], dtype=float)
        values = np.array([float(v) for _, v in pairs], dtype=float)
        out.append(Series(dict(item.get("metric", {})), times, values))
    return out
