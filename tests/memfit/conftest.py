"""Fixtures the %%memfit tests share."""

from __future__ import annotations

import pytest


@pytest.fixture
def onednn_off():
    """oneDNN off for the test: the dry run without a GPU takes torch's native kernels (a GPU
    never runs oneDNN), so the real CPU run it is compared with must take them too."""
    import torch

    was = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    yield
    torch._C._set_mkldnn_enabled(was)
