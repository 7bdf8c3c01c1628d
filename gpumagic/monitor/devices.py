"""Which physical GPUs this process sees, and under which CUDA index.

NVML numbers GPUs by PCI bus order and ignores ``CUDA_VISIBLE_DEVICES``; PyTorch's
``cuda:N`` counts only the visible ones, in the order that variable lists them. A chart
labelled with one numbering while the user thinks in the other points at the wrong GPU,
so every device carries both.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from gpumagic.device_kinds import CUDA, HOST, DeviceKind, device_key


@dataclass(frozen=True)
class WatchedDevice:
    """One row of every sample: a GPU (``kind="cuda"``) or the host (``kind="host"``).

    A MIG instance is a GPU row of its own: ``nvml_index`` is its parent board's index and
    ``mig_index`` its slot on that board (NVML's MIG device index). A GPU of a job on another
    node (read through Prometheus) has no CUDA index here: ``host`` names its node and
    ``node_index`` its index there (dcgm-exporter's ``gpu`` label), ``labels`` keeps the
    other labels its series carry.
    """

    kind: DeviceKind
    name: str
    nvml_index: int | None = None  # physical index (nvidia-smi's ``index``)
    cuda_index: int | None = None  # index as CUDA/PyTorch sees it (``cuda:N``)
    uuid: str | None = None
    mig_index: int | None = None  # set for a MIG instance
    host: str | None = None  # another node's GPU: the node (dcgm-exporter's Hostname)
    node_index: str | None = None  # ... and its index on that node, as labelled
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        """``cuda:0`` for a GPU, ``host`` for the host (the ``device`` column); a job's GPU
        is named by its node: ``node-1 GPU 3``."""
        if self.host is not None:
            return self.label
        return device_key(self.kind, self.cuda_index)

    @property
    def label(self) -> str:
        """Both numberings when they differ: ``cuda:0 (GPU 2)``; ``GPU 0`` when they agree;
        ``cuda:0 (GPU 0 MIG 1)`` for a MIG instance; ``node-1 GPU 3`` on another node."""
        if self.host is not None:
            return f"{self.host} GPU {self.node_index}"
        if self.kind != CUDA:
            return HOST
        if self.mig_index is not None:
            return f"cuda:{self.cuda_index} (GPU {self.nvml_index} MIG {self.mig_index})"
        if self.cuda_index == self.nvml_index:
            return f"GPU {self.nvml_index}"
        return f"cuda:{self.cuda_index} (GPU {self.nvml_index})"


def _norm_uuid(uuid: str) -> str:
    u = uuid.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if u.startswith(prefix):
            return u[len(prefix) :]
    return u


@dataclass(frozen=True)
class VisibleDevices:
    """What ``CUDA_VISIBLE_DEVICES`` exposes: NVML indexes of whole GPUs in CUDA order, or
    (a ``MIG-`` list) positions in the MIG UUID list; ``notes`` say what was ignored."""

    gpus: list[int]
    migs: list[int]
    notes: list[str]
    repeated: bool = False  # an entry repeats: CUDA exposes nothing


def _strtoul(token: str) -> int:
    """torch's reading of an ordinal (``_parse_visible_devices``, like C's ``strtoul``): the
    leading ``[+-]digits``, so ``1gpu2`` is 1; -1 when there are none."""
    end = 0
    for i, c in enumerate(token):
        if c.isdigit() or (i == 0 and c in "+-"):
            end = i + 1
        else:
            break
    try:
        return int(token[:end]) if end else -1
    except ValueError:  # a lone sign
        return -1


def _match_prefix(token: str, uuids: Sequence[str | None]) -> int | None:
    """The one UUID ``token`` is a prefix of (CUDA accepts abbreviations); None if none or
    several."""
    wanted = _norm_uuid(token)
    matches = [i for i, u in enumerate(uuids) if u is not None and _norm_uuid(u).startswith(wanted)]
    return matches[0] if len(matches) == 1 else None


def visible_devices(
    env: str | None, uuids: Sequence[str | None], mig_uuids: Sequence[str | None] = ()
) -> VisibleDevices:
    """Read ``CUDA_VISIBLE_DEVICES`` as torch and the CUDA runtime do (torch's
    ``_parse_visible_devices`` and ``_transform_uuid_to_ordinals`` in ``torch/cuda/__init__.py``):
    a watcher that read it more simply labelled the wrong GPU as ``cuda:N``.

    ``uuids``: the NVML UUIDs by NVML index; ``mig_uuids``: the MIG instances' UUIDs.
    The whole list is read in the mode of its first entry: ``GPU-`` UUID (prefixes),
    ``MIG-`` UUID, or ordinals read like ``strtoul`` (``1gpu2`` is 1); an entry of another
    kind, an unknown or ambiguous one, a negative ordinal or one past the last GPU ends
    the list; an entry repeated anywhere before that end makes CUDA expose no device at all.
    """
    count = len(uuids)
    if env is None:
        return VisibleDevices(list(range(count)), [], [])
    notes: list[str] = []

    def stop(token: str, why: str) -> None:
        if not token or (token.startswith("-") and not notes and token == entries[0].strip()):
            return  # "" or a leading "-1": the idioms for "no GPU", which the reason names
        notes.append(
            f"CUDA_VISIBLE_DEVICES entry {token!r} {why}: CUDA ignores it and every entry after it"
        )

    def repeated(token: str) -> VisibleDevices:
        notes.append(
            f"CUDA_VISIBLE_DEVICES={env!r} repeats {token!r}: CUDA then exposes no device at all"
        )
        return VisibleDevices([], [], notes, repeated=True)

    entries = env.split(",")
    for prefix, pool in (("GPU-", uuids), ("MIG-", mig_uuids)):
        if not env.startswith(prefix):
            continue
        chosen: list[int] = []
        seen: list[str] = []
        for token in entries:
            if token in seen:
                return repeated(token)
            if not token.startswith(prefix):
                stop(token, f"is not a {prefix} UUID like the first entry")
                break
            seen.append(token)
        for token in seen:
            index = _match_prefix(token, pool)
            if index is None:
                stop(token, "matches no device here (or several)")
                break
            if index in chosen:
                return repeated(token)
            chosen.append(index)
        if prefix == "GPU-":
            return VisibleDevices(chosen, [], notes)
        return VisibleDevices([], chosen, notes)
    ordinals: list[int] = []
    for token in entries:
        number = _strtoul(token.strip())
        if number in ordinals:
            return repeated(token.strip())
        if number < 0:
            stop(token.strip(), "is no GPU index")
            break
        if token.strip() != str(number):
            notes.append(
                f"CUDA_VISIBLE_DEVICES entry {token.strip()!r} reads as {number} "
                "(CUDA takes its leading digits)"
            )
        ordinals.append(number)
    chosen = []
    for number in ordinals:
        if number >= count:
            stop(str(number), "names no GPU")
            break
        chosen.append(number)
    return VisibleDevices(chosen, [], notes)


def parse_visible_devices(
    env: str | None, uuids: Sequence[str | None]
) -> tuple[list[int], list[str]]:
    """NVML indexes of the whole GPUs CUDA would expose, in CUDA order, plus notes on
    ignored entries (see :func:`visible_devices`; a ``MIG-`` list exposes no whole GPU)."""
    seen = visible_devices(env, uuids)
    return seen.gpus, seen.notes


def torch_visible_uuids() -> list[str] | None:
    """UUIDs of ``cuda:0..N-1`` from PyTorch, only if this process already initialised CUDA.

    The exact mapping when ``CUDA_DEVICE_ORDER`` is CUDA's default ``FASTEST_FIRST`` (which
    can differ from NVML's PCI order on mixed-GPU machines). Never initialises CUDA itself:
    that would create a context (hundreds of MiB) in a kernel that may not want one.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized() or getattr(torch.version, "hip", None):
            return None
        return [
            f"GPU-{torch.cuda.get_device_properties(i).uuid}"
            for i in range(torch.cuda.device_count())
        ]
    except Exception:  # any torch build quirk: fall back to the environment variable
        return None


def map_from_torch(torch_uuids: Sequence[str], uuids: Sequence[str | None]) -> list[int] | None:
    """NVML indexes for torch's UUID list, or None unless every one is found exactly once."""
    by_uuid = {_norm_uuid(u): i for i, u in enumerate(uuids) if u is not None}
    out: list[int] = []
    for t in torch_uuids:
        index = by_uuid.get(_norm_uuid(t))
        if index is None or index in out:
            return None
        out.append(index)
    return out
