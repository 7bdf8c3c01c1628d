"""The real GPU traces the tests and benchmarks read: a registry, and a fetch on first use.

They are other projects' files (origins, pinned commits and licences are listed in
``../shared/traces/README.md``), so they are never committed here. ``fetch(name)`` looks:

1. in ``../shared/traces/<name>`` beside the repository (the CI machine has it);
2. in the cache: ``$GPUMAGIC_TEST_DATA_DIR``, else the user's cache directory
   (``$XDG_CACHE_HOME/gpumagic/test-data``, by default ``~/.cache/gpumagic/test-data``);
3. failing both, it downloads into that cache: from ``$GPUMAGIC_TEST_DATA_URL/<name>``
   when that mirror is set (files under their registry names, sub-folders kept), else
   from the file's origin.

Every file is checked against its sha256, wherever it came from; a mismatch raises
``TraceCorrupted`` naming the file and both hashes. A download that cannot happen (offline,
no mirror) raises ``TraceUnavailable`` after one short try, and later files from the same
host fail at once, so an offline run skips its trace tests in moments.

This lives in tests/, not in the gpumagic package: fetching test data is no part of the
product. Downloads go through pooch (the registry-and-cache library SciPy and
scikit-image use); only a download needs it.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
MIRROR_ENV = "GPUMAGIC_TEST_DATA_URL"
CACHE_ENV = "GPUMAGIC_TEST_DATA_DIR"
# (connect, read) seconds. Offline, a name lookup fails at once; a host that drops packets
# must not hold the suite for minutes either, and nothing is retried.
TIMEOUT = (5, 30)

_KINETO = (
    "https://raw.githubusercontent.com/pytorch/kineto/"
    "be239c044d2f4b62982e1ff64144097acd69f59a/tb_plugin/samples/"
)
_HTA = (
    "https://raw.githubusercontent.com/facebookresearch/HolisticTraceAnalysis/"
    "f4d0062c382f42bd8a74838bcdad1916c7d5d2da/tests/data/"
)

# name (as under ../shared/traces) -> (sha256, origin at a pinned commit)
REGISTRY: dict[str, tuple[str, str]] = {
    "a100_alexnet_syncs.json.gz": (
        "b9febb1abc8cc729a2890fb6a4171de9867ba72c944437ee046067e7c89912dc",
        _HTA + "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    ),
    "a100_cupti_counters.json.gz": (
        "07e7e02da9cfda66f5b6fc5fd17e1f93185321504496f4c00e8d375fb162bf84",
        _HTA + "cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",
    ),
    "a100_training_control.json.gz": (
        "43ed872e4c5dc2e8da5946d761ed61923a75c6c799cc62be9e1c859d440a56fd",
        _HTA + "trace_diff/control/control.json.gz",
    ),
    "a100_triton_kernel.json.gz": (
        "f1702aba1e49885c42a7bf5ab8b63b82a0d630acd41180d87199401dd202ccfb",
        _HTA + "triton_example/triton_example.json.gz",
    ),
    "cpu_only.json.gz": (
        "b2ff87b29bd604b0c30bca65915af4388b53a7f421f0897c68a7862e1559b6e5",
        _HTA + "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    ),
    "mtia_single_rank.json.gz": (
        "74786104b3c45f02b805a5c346a8202c3ecc318a566a65e0b47c56d706374f80",
        _HTA + "mtia_trace_single_rank/mtia_rank_0.json.gz",
    ),
    "mtia_inference.json.gz": (
        "ed1b118e53f23f3a3a055dec52f6cc45eaf32c6354e8693335cfca608cff84f5",
        _HTA + "mtia_inference_trace/mtia_inference_rank_0.json.gz",
    ),
    "mi250_rocm_minitoy.json.gz": (
        "39fdab670f9e80a05ccc6d0d07611b3aeba1092fa10681d8dd08cea48d0488b5",
        _HTA + "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    ),
    "resnet50_v100_num_workers_0.json.gz": (
        "da8bcc1a45ec0c3fd8b3c0acf64fbd42c10f31b854707b47561fd4f6cc084108",
        _KINETO + "resnet50_num_workers_0/worker0.1623143566756.pt.trace.json.gz",
    ),
    "resnet50_v100_num_workers_4.json.gz": (
        "e4e6a307dd28e4aae8c93d059a100fd9dd9097b197de278c175e34e6ec69de01",
        _KINETO + "resnet50_num_workers_4/worker0.1623213129365.pt.trace.json.gz",
    ),
    "v100_training_5steps.json.gz": (
        "e279d7280e73719e8dd9550e120cfe081fbe268596bd297fe5fcbf63e2b75a09",
        _HTA + "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    ),
    "v100_training_test.json.gz": (
        "5e69e04ed19b2dbf59e632008146c1bd6da417dc3af7ab4885c619b11e34f1bf",
        _HTA + "trace_diff/test/test.json.gz",
    ),
    "two_ranks/rank-0.json.gz": (
        "71b98c30a2751cc56d9bf78f8fb76467acd56e0be6a1f0da23c600941d29aafd",
        _HTA + "timeline_analysis/sampled_rank-0.json.gz",
    ),
    "two_ranks/rank-1.json.gz": (
        "2f9a65fd5f319ec8e60468a22dc9a624eb4b40369c729f6f897259d587eca57e",
        _HTA + "trace_filter/sampled_rank-1.json.gz",
    ),
}


class TraceUnavailable(Exception):
    """The trace is not beside the repository, not cached, and could not be downloaded."""


class TraceCorrupted(Exception):
    """A trace's bytes do not have the registry's sha256."""

    def __init__(self, name: str, source: str, expected: str, got: str) -> None:
        super().__init__(
            f"{name} from {source} does not match the registry: "
            f"sha256 expected {expected}, got {got}"
        )
        self.name, self.source, self.expected, self.got = name, source, expected, got


# Paths already checked in this process, with the (size, mtime) they had then.
_verified: dict[Path, tuple[int, int]] = {}
# host -> why it could not be reached: the rest of the run does not try it again.
_unreachable: dict[str, str] = {}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(name: str) -> Path:
    """The local path of a registered trace (or of a folder of them, e.g. ``two_ranks``)."""
    if name not in REGISTRY:
        members = [n for n in REGISTRY if n.startswith(name.rstrip("/") + "/")]
        if not members:
            raise KeyError(f"{name!r} is not in the trace registry (tests/trace_data.py)")
        folders = {fetch(n).parent for n in members}
        if len(folders) > 1:  # e.g. half of the folder in ../shared, half in the cache
            raise TraceUnavailable(f"the files of {name}/ lie in different places: {folders}")
        return folders.pop()

    expected, _ = REGISTRY[name]
    path = SHARED / name  # read at call time: the tests of this module point it elsewhere
    if path.is_file():
        stat = path.stat()
        if _verified.get(path) != (stat.st_size, stat.st_mtime_ns):
            got = sha256(path)
            if got != expected:
                raise TraceCorrupted(name, str(path), expected, got)
            _verified[path] = (stat.st_size, stat.st_mtime_ns)
        return path
    return _download(name, expected)


def _download(name: str, expected: str) -> Path:
    """Through pooch: a file already in the cache with the right sha256 is used as it is; a
    missing or stale one is downloaded to a temporary name, checked, then moved in place."""
    mirror = os.environ.get(MIRROR_ENV, "").strip()
    try:
        import pooch
    except ImportError as exc:
        raise TraceUnavailable(
            f"{name}: pooch is not installed (pip install -e '.[test]'), and there is no "
            f"{SHARED} beside the repository"
        ) from exc
    store = pooch.create(
        path=pooch.os_cache("gpumagic") / "test-data",
        env=CACHE_ENV,
        base_url=mirror.rstrip("/") + "/",
        registry={n: f"sha256:{h}" for n, (h, _) in REGISTRY.items()},
        urls={} if mirror else {n: url for n, (_, url) in REGISTRY.items()},
        retry_if_failed=0,
    )
    url = store.get_url(name)
    host = urlsplit(url).netloc
    if host in _unreachable:
        cause = f"{_unreachable[host]}, earlier in this run: not tried again"
        raise TraceUnavailable(_unavailable(name, url, cause, store.abspath))
    return Path(store.fetch(name, downloader=_Downloader(name, expected, store.abspath)))


class _Downloader:
    """pooch's HTTP download with a short timeout; tells a network failure (skip) from a
    file with the wrong bytes (an error naming both hashes) before pooch's own check."""

    def __init__(self, name: str, expected: str, cache: Path) -> None:
        self.name, self.expected, self.cache = name, expected, cache

    def __call__(self, url: str, output_file: str, store: Any) -> None:
        import pooch
        import requests

        try:
            pooch.HTTPDownloader(timeout=TIMEOUT)(url, output_file, store)
        except requests.RequestException as exc:
            cause = _describe(exc)
            if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
                _unreachable[urlsplit(url).netloc] = cause
            raise TraceUnavailable(_unavailable(self.name, url, cause, self.cache)) from exc
        got = sha256(Path(output_file))
        if got != self.expected:  # pooch deletes the temporary file on the way out
            raise TraceCorrupted(self.name, url, self.expected, got)


def _describe(exc: Exception) -> str:
    # requests wraps urllib3's MaxRetryError, whose .reason is the line worth reading, once
    # the connection object's name is cut off ("Failed to resolve 'raw.githubusercontent.com'
    # ([Errno -2] Name or service not known)", "... [Errno 111] Connection refused").
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    text = str(reason or exc)
    text = re.sub(r"^(<[^>]*>|\w+\(host=[^)]*\)): ", "", text)
    return f"{type(exc).__name__}: {text}"


def _unavailable(name: str, url: str, cause: str, cache: Path) -> str:
    if os.environ.get(MIRROR_ENV, "").strip():
        advice = f"check that the mirror {MIRROR_ENV} serves the traces under their registry names"
    else:
        advice = f"offline, set {MIRROR_ENV} to a mirror of the traces (see README, Development)"
    return (
        f"real trace {name} unavailable: {cause} (fetching {url}); "
        f"not in the cache {cache}, no {SHARED}; {advice}"
    )


def require_trace(name: str) -> Path:
    """fetch(name) for a test: a trace that cannot be had skips the test, saying why."""
    try:
        return fetch(name)
    except TraceUnavailable as exc:
        import pytest

        pytest.skip(str(exc))
