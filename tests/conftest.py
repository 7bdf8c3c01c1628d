"""Shared fixtures: a real IPython shell with the extension loaded (real traces: trace_data.py)."""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
# No GPUMAGIC_LIVE here: the in-process test shell has no kernel, so live views are off by
# themselves, and a variable set here would leak into the kernels the notebook and browser
# tests start.


@pytest.fixture(scope="session")
def shell():
    from IPython.testing import globalipapp

    globalipapp.start_ipython()  # returns None when another fixture started it first
    ip = globalipapp.get_ipython()
    ip.run_cell("%load_ext gpumagic", store_history=False)
    yield ip


@pytest.fixture
def ip(shell):
    """The shell with user variables from earlier tests removed."""
    keep = set(shell.user_ns_hidden)
    for name in list(shell.user_ns):
        if name not in keep and not name.startswith("_"):
            del shell.user_ns[name]
    shell.user_ns.pop("_memtrace", None)
    return shell


class Run:
    """What a cell did: the ExecutionResult, captured stdout and rich outputs."""

    def __init__(self, result, cap):
        self.result = result
        self.stdout = cap.stdout
        self.outputs = cap.outputs

    @property
    def bundles(self):
        return [o.data for o in self.outputs]

    def html(self) -> str:
        return "".join(b.get("text/html", "") for b in self.bundles)

    @property
    def plain_stdout(self) -> str:
        return re.sub(r"\x1b\[[0-9;]*m", "", self.stdout)


@pytest.fixture
def run(ip):
    """run(cell) -> Run, capturing stdout and display outputs."""
    from IPython.utils.capture import capture_output

    def _run(cell: str, **kw) -> Run:
        with capture_output() as cap:
            result = ip.run_cell(cell, store_history=True, **kw)
        return Run(result, cap)

    return _run


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
