"""The GPUs ``%%memfit --gpu NAME`` knows: the card table of :mod:`gpumagic.cards`, shared
with ``%gpucheck`` (issue 29), under the names memfit has always imported."""

from __future__ import annotations

from gpumagic.cards import GPUS, GiB, GpuSpec, MiB, find_gpu, gpu_names

__all__ = ["GPUS", "GiB", "GpuSpec", "MiB", "find_gpu", "gpu_names"]
