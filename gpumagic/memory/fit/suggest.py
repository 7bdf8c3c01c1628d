"""The ``%%memfit`` line that answers "what fits", for reports that end with a next step
(``%%memtrace``'s out-of-memory report), and the batch-size variable a cell reads."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpumagic.cards import find_gpu
from gpumagic.namespace import is_a

# Names a batch size goes by, in the order they are looked for (``--what-if batch``, and the
# line an out-of-memory report offers).
BATCH_NAMES = ("batch_size", "BATCH_SIZE", "bs", "batch", "BATCH", "B")
_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def batch_variable(names: Iterable[str], namespace: Mapping[str, Any]) -> tuple[str, int] | None:
    """The first of :data:`BATCH_NAMES` among ``names`` whose value in ``namespace`` is a
    count above 1, with that value."""
    names = set(names)
    for name in BATCH_NAMES:
        value = namespace.get(name)
        if name in names and is_a(value, int) and not is_a(value, bool) and value > 1:
            return name, value
    return None


def names_in(sources: Iterable[str]) -> set[str]:
    """The identifiers in ``sources`` (a cell's statements as typed)."""
    return {m.group(0) for source in sources for m in _NAME.finditer(source)}


def memfit_line(
    device_name: str | None = None,
    batch_variable: str | None = None,
    batch_value: int | None = None,
    memory: int | None = None,
) -> str:
    """``%%memfit --gpu "A100 80GB" --batch batch_size=16,32,64 --what-if all``: the card the
    cell ran out on (by the name torch gives it, when the table has it; else ``memory``, its
    size, when given), the batch variable when one is known (sizes around its value), and
    every fix."""
    spec = find_gpu(device_name) if device_name else None
    parts = ["%%memfit"]
    if spec is not None:
        parts.append(f'--gpu "{spec.name}"')
    elif memory:
        # rounded down: the line never offers more memory than the card has
        parts.append(f"--memory {math.floor(memory / 2**30 * 10) / 10:.1f}GiB")
    if batch_variable:
        if batch_value and batch_value > 1:
            sizes = sorted({max(1, batch_value // 4), max(1, batch_value // 2), batch_value})
        else:
            sizes = [8, 16, 32]
        parts.append(f"--batch {batch_variable}={','.join(str(s) for s in sizes)}")
    parts.append("--what-if all")
    return " ".join(parts)


def oom_memfit_line(
    *,
    cuda: bool,
    device: str,
    total: int | None,
    sources: Iterable[str],
    namespace: Mapping[str, Any],
    gpu_here: bool,
) -> str:
    """The line an out-of-memory report of ``%%memtrace`` ends with.

    CUDA ran out: the card (``device`` is the report's label, "cuda:0 (NVIDIA A100-SXM4-80GB)")
    or, when the table lacks it, its ``total``, with the batch the cell read. The host ran
    out: no target, so the dry run judges every card of the table (or this machine's GPU,
    ``gpu_here``); ``--batch`` needs a target, so it is offered only with a GPU here."""
    found = batch_variable(names_in(sources), namespace)
    name = None
    if cuda:
        m = re.search(r"\((.+)\)\s*$", device)
        name = m.group(1) if m else device
    targeted = cuda or gpu_here
    var, value = found if found is not None and targeted else (None, None)
    return memfit_line(name, var, value, memory=total if cuda else None)


__all__ = ["BATCH_NAMES", "batch_variable", "memfit_line", "names_in", "oom_memfit_line"]
