"""serve_metrics on a real GPU: NVML's values under DCGM's names, labelled as dcgm-exporter
labels them. Skipped without a CUDA GPU and NVML (no Prometheus needed: the page is parsed
with prometheus_client's own parser)."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from watch_helpers import nvml_and_cuda, wait_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not nvml_and_cuda(), reason="needs a CUDA GPU and NVML"),
]


def test_a_real_gpu_is_served_under_dcgm_names() -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    import torch

    from gpumagic.monitor import serve_metrics, watch

    x = torch.ones(256, 1024, 1024, device="cuda")  # 1 GiB held while served
    w = watch(interval=0.2, cells=False)
    server = serve_metrics(0, watcher=w)
    try:
        assert wait_for(lambda: w.samples_taken >= 3, 10)
        with urllib.request.urlopen(server.url, timeout=5) as r:
            families = {f.name: f for f in parser.text_string_to_metric_families(r.read().decode())}
        samples = w.result().samples
    finally:
        w.stop()
    assert server.stopped
    uuid = f"GPU-{torch.cuda.get_device_properties(0).uuid}"
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    mine = [s for s in util if s.labels["UUID"] == uuid]
    assert len(mine) == 1
    labels = mine[0].labels
    assert labels["Hostname"] == socket.gethostname()
    assert labels["modelName"] == torch.cuda.get_device_name(0)
    assert labels["device"] == f"nvidia{labels['gpu']}"
    gpu_rows = samples[samples["name"] == labels["modelName"]]
    assert mine[0].value in set(gpu_rows["utilization_gpu"])
    used = next(s for s in families["DCGM_FI_DEV_FB_USED"].samples if s.labels["UUID"] == uuid)
    assert used.value * 2**20 in set(gpu_rows["memory_used"]) and used.value >= 1024
    free = next(s for s in families["DCGM_FI_DEV_FB_FREE"].samples if s.labels["UUID"] == uuid)
    total = gpu_rows["memory_total"].iloc[-1] / 2**20
    assert used.value + free.value == pytest.approx(total)
    own = next(
        s
        for s in families["gpumagic_kernel_gpu_memory_used_bytes"].samples
        if s.labels["UUID"] == uuid
    )
    assert own.value >= 2**30
    # the host's numbers never appear as a GPU's
    assert all(s.labels["UUID"].startswith("GPU-") for s in util)
    del x
