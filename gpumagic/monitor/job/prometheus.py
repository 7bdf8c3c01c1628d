"""A small client for Prometheus's HTTP API (``/api/v1/query``, ``/api/v1/query_range``).

Standard library only for the HTTP (``urllib``), msgspec for the JSON: the job view needs
two endpoints and a decoder that checks what it reads. Every call has a hard deadline: the
socket timeout bounds connecting and each read, but not a name lookup (``getaddrinfo``
ignores it, and a dead resolver can hold it for tens of seconds), so the request runs on a
daemon thread that is abandoned once the deadline passes. The reader itself stops at that
deadline too (it reads in chunks and looks at the clock between them) and at
:data:`MAX_ANSWER_BYTES`, so an answer that never ends costs neither memory nor a thread
that reads on (issue 25 item 11).

Every answer is decoded into the shape the API documents (``status``, ``data.resultType``,
``data.result``: label names and values strings, each sample a ``[time, "value"]`` pair, each
value a number as text): anything else is refused, never half-read. Whatever goes wrong
becomes a :class:`PrometheusError` (a ``ValueError``) whose message names the URL and what
was wrong, and the query where Prometheus rejected one (issue 25 item 10).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

DEFAULT_TIMEOUT_S = 3.0

# The largest answer read. The job view's largest answer is the window's history: a series
# per GPU and field (9 fields), each ~400 bytes of labels (dcgm-exporter's, plus the scrape's
# and Kubernetes' pod labels) and ~25 bytes per point. Written out in Prometheus's format, for
# 1,024 GPUs (9,216 series) the instant query is 3.8 MiB and the history at the default window
# (300 s at 5 s, 61 points) 16.5 MiB; for 4,096 GPUs the history is spaced out to the source's
# budget of 1,000,000 points (27 per series): 37 MiB. 128 MiB is well above all of these and
# bounds what a server that never stops answering (or something else at the URL) costs.
MAX_ANSWER_BYTES = 128 * 1024 * 1024
# An error page or a rejection says what it has to say in far less.
_MAX_ERROR_BYTES = 1024 * 1024
# Read in chunks, the clock and the limit checked between them.
_CHUNK = 256 * 1024


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


# -- the API's answer, as its documentation gives it (prometheus.io/docs/prometheus/latest/
# querying/api/): decoded and checked in one pass; unknown keys (warnings, infos) ignored.
class _Instant(msgspec.Struct):
    metric: dict[str, str]
    value: tuple[float, str]


class _Range(msgspec.Struct):
    metric: dict[str, str]
    values: list[tuple[float, str]]


class _Vector(msgspec.Struct, tag_field="resultType", tag="vector"):
    result: list[_Instant]


class _Matrix(msgspec.Struct, tag_field="resultType", tag="matrix"):
    result: list[_Range]


class _Scalar(msgspec.Struct, tag_field="resultType", tag="scalar"):
    result: tuple[float, str]


class _String(msgspec.Struct, tag_field="resultType", tag="string"):
    result: tuple[float, str]


class _Answer(msgspec.Struct):
    status: str
    data: _Vector | _Matrix | _Scalar | _String | None = None
    errorType: str = ""  # the API's name
    error: str = ""


_DECODER = msgspec.json.Decoder(_Answer)


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
        return self._series(self._get("/api/v1/query", params, expr), "/api/v1/query")

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        """A range query (``/api/v1/query_range``): the expression at ``start + k * step``."""
        params = {
            "query": expr,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": f"{max(step, 0.001):.3f}",
        }
        return self._series(self._get("/api/v1/query_range", params, expr), "/api/v1/query_range")

    def _get(self, path: str, params: dict[str, str], expr: str) -> _Answer:
        # Prometheus stops evaluating a query past its own timeout too (then says so).
        params = {**params, "timeout": f"{self.timeout:g}s"}
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        box: dict[str, Any] = {}
        deadline = time.monotonic() + self.timeout
        cancelled = threading.Event()

        def fetch() -> None:
            try:
                box["answer"] = self._fetch(url, path, expr, deadline, cancelled)
            except BaseException as exc:  # handed to the caller's thread
                box["error"] = exc

        thread = threading.Thread(target=fetch, name="gpumagic-prometheus", daemon=True)
        thread.start()
        thread.join(self.timeout + 0.5)
        if thread.is_alive():
            # Still in a name lookup or a read: it stops at its next chunk, reading nothing more.
            cancelled.set()
            raise PrometheusError(self._late())
        if "error" in box:
            raise box["error"]
        answer: _Answer = box["answer"]
        return answer

    def _late(self) -> str:
        return f"Prometheus at {self.url} did not answer within {self.timeout:g} s"

    def _fetch(
        self, url: str, path: str, expr: str, deadline: float, cancelled: threading.Event
    ) -> _Answer:
        # imported here: urllib.request pulls in http.client, email and ssl (a few tens of ms)
        # that `import gpumagic` should not pay for
        import http.client
        import urllib.error
        import urllib.request

        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = self._read(response, MAX_ANSWER_BYTES, deadline, cancelled)
        except urllib.error.HTTPError as exc:
            # a rejected query comes back as 400/422 with Prometheus's JSON explanation
            raw = self._error_body(exc, deadline, cancelled)
            refused = _decode(raw)
            if refused is not None and refused.status == "error":
                raise PrometheusError(_refused(self.url, expr, refused)) from None
            raise PrometheusError(
                f"Prometheus at {self.url} answered HTTP {exc.code} {exc.reason}"
                + (" (is this the Prometheus server's URL?)" if exc.code == 404 else "")
            ) from None
        except urllib.error.URLError as exc:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {exc.reason}") from None
        except http.client.HTTPException as exc:  # not HTTP, or an answer cut short
            raise PrometheusError(
                f"Prometheus at {self.url} gave a broken HTTP answer ({type(exc).__name__}: {exc})"
            ) from None
        except TimeoutError:
            raise PrometheusError(self._late()) from None
        except OSError as exc:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {exc}") from None
        return self._answer(raw, path, expr)

    def _read(
        self, response: Any, limit: int, deadline: float, cancelled: threading.Event
    ) -> bytes:
        """The body, in chunks: never more than ``limit`` bytes, never past the deadline."""
        said = response.headers.get("Content-Length") if response.headers else None
        length = int(said) if said is not None and said.strip().isdigit() else None
        if length is not None and length > limit:
            raise PrometheusError(self._too_big(limit, length))
        # read1: at most one socket read per call, so a server that trickles still lets the
        # loop look at the clock (read(n) waits for n bytes)
        read = getattr(response, "read1", response.read)
        chunks: list[bytes] = []
        size = 0
        while True:
            if cancelled.is_set() or time.monotonic() > deadline:
                raise PrometheusError(self._late())
            chunk = read(_CHUNK)
            if not chunk:
                if length is not None and size < length:  # read1 does not raise IncompleteRead
                    raise PrometheusError(
                        f"Prometheus at {self.url} broke off its answer after {size:,} of "
                        f"the {length:,} bytes it announced"
                    )
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise PrometheusError(self._too_big(limit))
            chunks.append(chunk)

    def _error_body(self, exc: Any, deadline: float, cancelled: threading.Event) -> bytes:
        try:
            body: bytes = self._read(exc, _MAX_ERROR_BYTES, deadline, cancelled)
            return body
        except Exception:  # an error page that cannot be read: its status says enough
            return b""
        finally:
            with contextlib.suppress(Exception):
                exc.close()

    def _too_big(self, limit: int, length: int | None = None) -> str:
        said = f" (it announced {length / 2**20:,.0f} MiB)" if length is not None else ""
        return (
            f"Prometheus at {self.url} sent an answer larger than {limit / 2**20:g} MiB{said}: "
            "stopped reading it (the job view's answers are a few MiB; is this Prometheus?)"
        )

    def _answer(self, raw: bytes, path: str, expr: str) -> _Answer:
        """The answer decoded and checked, or an error naming the URL and what was wrong."""
        try:
            answer = _DECODER.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            doc = _json(raw)
            if not isinstance(doc, dict) or "status" not in doc:
                raise PrometheusError(
                    f"{self.url} did not answer as Prometheus's HTTP API does (no JSON status): "
                    "is this the Prometheus server's URL?"
                ) from None
            raise PrometheusError(
                f"Prometheus at {self.url} answered {path} with a malformed result: {exc}"
            ) from None
        if answer.status == "error":
            raise PrometheusError(_refused(self.url, expr, answer))
        if answer.status != "success" or answer.data is None:
            raise PrometheusError(
                f"Prometheus at {self.url} answered {path} with status "
                f"{answer.status!r}"
                + ("" if answer.data is not None else " and no data")
                + ", not 'success' with data"
            )
        return answer

    def _series(self, answer: _Answer, path: str) -> list[Series]:
        """The result as Series: a vector gives one sample per series, a matrix many; a scalar
        or a string gives none (the job view never asks for one)."""
        data = answer.data
        items: list[tuple[dict[str, str], list[tuple[float, str]]]]
        if isinstance(data, _Vector):
            items = [(r.metric, [r.value]) for r in data.result]
        elif isinstance(data, _Matrix):
            items = [(r.metric, r.values) for r in data.result]
        else:
            return []
        out = []
        for labels, pairs in items:
            times = np.array([t for t, _ in pairs], dtype=float)
            text = [v for _, v in pairs]
            try:
                # Prometheus writes values as text ("NaN", "+Inf" included): numpy reads them all
                values = np.array(text, dtype=str).astype(float) if text else np.empty(0)
            except ValueError:
                bad = next(v for v in text if not _is_number(v))
                raise PrometheusError(
                    f"Prometheus at {self.url} answered {path} with a value that is not a "
                    f"number: {bad[:40]!r} for {_shown(labels)}"
                ) from None
            out.append(Series(labels, times, values))
        return out

    def __repr__(self) -> str:
        return f"<PrometheusClient {self.url}>"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _shown(labels: dict[str, str]) -> str:
    name = labels.get("__name__", "")
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return (name + "{" + rest + "}")[:200]


def _decode(raw: bytes) -> _Answer | None:
    try:
        return _DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _json(raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


def _refused(url: str, expr: str, answer: _Answer) -> str:
    kind = answer.errorType or "error"
    return f"Prometheus at {url} refused the query {expr}: {kind}: {answer.error}"
