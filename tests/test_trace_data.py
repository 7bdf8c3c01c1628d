"""The test-data fetch: real traces served by a mirror on 127.0.0.1, into a temporary cache.

Nothing here reaches the internet: every URL is a local http.server (or a closed port on
127.0.0.1), and ../shared/traces is pointed at a folder that does not exist.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import socket
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import trace_data
from trace_data import CACHE_ENV, MIRROR_ENV, REGISTRY, TraceCorrupted, TraceUnavailable, fetch

SMALL = "cpu_only.json.gz"


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[object]:
    """serve(folder) -> base URL of a local http.server for that folder (stopped after)."""
    servers: list[ThreadingHTTPServer] = []

    def _serve(folder: Path) -> str:
        handler = functools.partial(_QuietHandler, directory=str(folder))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield _serve
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def real_mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out as a mirror must be: every registered trace under its registry name,
    copied from wherever this run gets them (../shared/traces or the cache)."""
    root = tmp_path_factory.mktemp("mirror")
    for name in REGISTRY:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(trace_data.require_trace(name), root / name)
    return root


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache, no ../shared/traces, no mirror, nothing remembered from other fetches."""
    monkeypatch.setattr(trace_data, "SHARED", tmp_path / "no-shared" / "traces")
    monkeypatch.setattr(trace_data, "_unreachable", {})
    monkeypatch.setattr(trace_data, "_verified", {})
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    return tmp_path / "cache"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_trace_comes_from_the_mirror_into_the_cache(cache, real_mirror, serve, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, serve(real_mirror) + "/")  # a trailing slash is fine too
    for name, (sha, _) in REGISTRY.items():
        path = fetch(name)
        assert path == cache / name  # sub-folders kept: two_ranks/rank-0.json.gz
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha
        assert path.read_bytes() == (real_mirror / name).read_bytes()
    assert sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*.gz")) == sorted(REGISTRY)


def test_a_folder_of_traces_is_fetched_whole(cache, real_mirror, serve, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, serve(real_mirror))
    folder = fetch("two_ranks")
    assert folder == cache / "two_ranks"
    assert sorted(p.name for p in folder.iterdir()) == ["rank-0.json.gz", "rank-1.json.gz"]


def test_a_cached_file_is_used_without_the_network(cache, real_mirror, serve, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, serve(real_mirror))
    first = fetch(SMALL)
    monkeypatch.setenv(MIRROR_ENV, f"http://127.0.0.1:{_closed_port()}")
    assert fetch(SMALL) == first


def test_without_a_mirror_the_origin_is_fetched(cache, real_mirror, tmp_path, serve, monkeypatch):
    origin_dir = tmp_path / "origin" / "cpu_only"
    origin_dir.mkdir(parents=True)
    shutil.copyfile(real_mirror / SMALL, origin_dir / "rank-34.pt.trace.json.gz")
    origin = serve(tmp_path / "origin") + "/cpu_only/rank-34.pt.trace.json.gz"
    monkeypatch.setitem(REGISTRY, SMALL, (REGISTRY[SMALL][0], origin))
    path = fetch(SMALL)
    assert path == cache / SMALL  # stored under its registry name, whatever the origin calls it
    assert path.read_bytes() == (real_mirror / SMALL).read_bytes()


def test_a_corrupted_download_is_refused(cache, tmp_path, serve, monkeypatch):
    mirror = tmp_path / "bad-mirror"
    mirror.mkdir()
    bad = b"\x1f\x8b not the trace the registry names"
    (mirror / SMALL).write_bytes(bad)
    monkeypatch.setenv(MIRROR_ENV, serve(mirror))
    with pytest.raises(TraceCorrupted) as info:
        fetch(SMALL)
    message = str(info.value)
    assert SMALL in message
    assert REGISTRY[SMALL][0] in message
    assert hashlib.sha256(bad).hexdigest() in message
    assert not any(p.is_file() for p in cache.rglob("*")), "a refused file stayed in the cache"


def test_a_corrupted_cached_file_is_fetched_again(cache, real_mirror, serve, monkeypatch):
    (cache / SMALL).parent.mkdir(parents=True)
    (cache / SMALL).write_bytes(b"truncated")
    monkeypatch.setenv(MIRROR_ENV, serve(real_mirror))
    assert fetch(SMALL).read_bytes() == (real_mirror / SMALL).read_bytes()


def test_a_corrupted_file_beside_the_repository_is_an_error(cache, tmp_path, monkeypatch):
    shared = tmp_path / "shared" / "traces"
    (shared / "two_ranks").mkdir(parents=True)
    (shared / "two_ranks" / "rank-1.json.gz").write_bytes(b"edited")
    monkeypatch.setattr(trace_data, "SHARED", shared)
    with pytest.raises(TraceCorrupted) as info:
        fetch("two_ranks/rank-1.json.gz")
    message = str(info.value)
    assert str(shared / "two_ranks" / "rank-1.json.gz") in message
    assert REGISTRY["two_ranks/rank-1.json.gz"][0] in message
    assert hashlib.sha256(b"edited").hexdigest() in message


def test_an_unreachable_mirror_skips_saying_why(cache, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(pytest.skip.Exception) as info:
        trace_data.require_trace(SMALL)
    reason = str(info.value)
    assert SMALL in reason
    assert MIRROR_ENV in reason
    assert "Connection refused" in reason
    # the next trace from that host is not tried again: an offline run skips in moments
    with pytest.raises(TraceUnavailable, match="not tried again"):
        fetch("two_ranks/rank-0.json.gz")
    assert not any(p.is_file() for p in cache.rglob("*"))


def test_an_unreachable_origin_skips_naming_the_mirror_variable(cache, monkeypatch):
    sha, _ = REGISTRY[SMALL]
    origin = f"http://127.0.0.1:{_closed_port()}/origin/{SMALL}"
    monkeypatch.setitem(REGISTRY, SMALL, (sha, origin))
    with pytest.raises(pytest.skip.Exception) as info:
        trace_data.require_trace(SMALL)
    reason = str(info.value)
    assert origin in reason
    assert f"set {MIRROR_ENV} to a mirror" in reason
    assert "Connection refused" in reason


def test_a_missing_file_on_the_mirror_skips(cache, tmp_path, serve, monkeypatch):
    (tmp_path / "empty-mirror").mkdir()
    monkeypatch.setenv(MIRROR_ENV, serve(tmp_path / "empty-mirror"))
    with pytest.raises(TraceUnavailable, match="404"):
        fetch(SMALL)


def test_a_name_outside_the_registry_is_a_key_error(cache):
    with pytest.raises(KeyError, match="not in the trace registry"):
        fetch("resnet50.json.gz")
