"""The ``%%memfit`` line that answers "what fits", for reports that end with a next step
(``%%memtrace``'s out-of-memory report)."""

from __future__ import annotations

from gpumagic.memory.fit.gpus import find_gpu


def memfit_line(device_name: str | None = None, batch_variable: str | None = None, batch_value: int | None = None) -> str:
    """``%%memfit --gpu "A100 80GB" --batch batch_size=16,32,64 --what-if all``: the card the
    cell ran out on (by the name torch gives it, when the table has it), the batch variable
    when one is known (sizes around its value), and every fix."""
    spec = find_gpu(device_name) if device_name else None
    parts = ["%%memfit"]
    if spec is not None:
        parts.append(f'--gpu "{spec.name}"')
    if batch_variable:
        if batch_value and batch_value > 1:
            sizes = sorted({max(1, batch_value // 4), max(1, batch_value // 2), batch_value})
        else:
            sizes = [8, 16, 32]
        parts.append(f"--batch {batch_variable}={','.join(str(s) for s in sizes)}")
    parts.append("--what-if all")
    return " ".join(parts)
