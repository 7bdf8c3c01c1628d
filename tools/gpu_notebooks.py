"""Execute one tutorial notebook with nbclient and write its HTML copy (``gpu_check.py``'s
"notebooks" part; on its own: ``python3 tools/gpu_notebooks.py notebooks/01_quickstart.ipynb
--html 01.html --json 01.json``).

The notebook runs in a copy of its folder (the files it writes stay out of the tree), on
the ``python3`` kernel of this interpreter (ipykernel's own spec: no kernelspec need be
installed), so the kernel inherits PYTHONPATH and imports gpumagic from the repository.
Its parameters cell picks the size: the GPU size wherever ``torch.cuda.is_available()``.
As tests/test_notebooks.py asks: a cell tagged ``raises-exception`` may fail, no other
may, and at least one gpumagic report must show. The HTML copy is written whatever
happened, with the outputs so far. One JSON object goes to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _outputs(cell: Any) -> list[Any]:
    return list(cell.get("outputs", [])) if cell.get("cell_type") == "code" else []


def _text(outputs: list[Any]) -> str:
    parts = []
    for o in outputs:
        if o.get("output_type") == "stream":
            parts.append(o.get("text", ""))
        elif "text/plain" in o.get("data", {}):
            parts.append(o["data"]["text/plain"])
    return "".join(parts)


def examine(nb: Any) -> dict[str, Any]:
    """Errors outside ``raises-exception`` cells, whether a gpumagic report shows, the size."""
    errors = []
    reports = 0
    for i, cell in enumerate(nb.cells):
        tags = cell.get("metadata", {}).get("tags", [])
        for o in _outputs(cell):
            if o.get("output_type") == "error" and "raises-exception" not in tags:
                errors.append(f"cell {i}: {o.get('ename')}: {str(o.get('evalue'))[:300]}")
            if 'class="gpumagic' in o.get("data", {}).get("text/html", ""):
                reports += 1
    params = ""
    for cell in nb.cells:
        text = _text(_outputs(cell)).strip()
        if text:
            params = text.splitlines()[0]
            break
    # the parameters cells print the device or backend they chose ("device=cuda", "over nccl")
    gpu_size = "cuda" in params or "nccl" in params
    return {"errors": errors, "reports": reports, "parameters": params, "gpu_size": gpu_size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebook")
    parser.add_argument("--html", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--budget", type=float, default=150.0, help="seconds for the whole notebook")
    parser.add_argument("--pidfile", help="write the kernel's process group here (the runner kills it if left)")
    args = parser.parse_args(argv)
    import nbclient
    import nbformat
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
    from nbconvert import HTMLExporter

    # the runner interrupts with SIGINT, then kills: turn a SIGTERM into the same clean stop
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    src = Path(args.notebook).resolve()
    work = Path(tempfile.mkdtemp(prefix=f"nb-{src.stem}-"))
    for f in src.parent.iterdir():
        if f.is_file():
            shutil.copy2(f, work / f.name)
    nb = nbformat.read(work / src.name, as_version=4)
    start = time.monotonic()
    deadline = start + args.budget
    client = nbclient.NotebookClient(
        nb,
        timeout=int(max(args.budget, 1)),
        kernel_name="python3",
        resources={"metadata": {"path": str(work)}},
    )
    failure = ""
    timed_out = False

    def on_cell_start(cell: Any, cell_index: int) -> None:  # each cell gets what is left
        client.timeout = int(max(deadline - time.monotonic(), 1))

    def on_notebook_start(notebook: Any) -> None:
        # the kernel runs in a session of its own: if this process is killed, the runner
        # ends the kernel's group, so no orphan keeps GPU memory from the next notebook
        pgid = getattr(getattr(client.km, "provisioner", None), "pgid", None)
        if args.pidfile and pgid:
            Path(args.pidfile).write_text(str(pgid))

    client.on_cell_start = on_cell_start
    client.on_notebook_start = on_notebook_start
    try:
        client.execute()
    except CellTimeoutError as exc:
        timed_out, failure = True, f"timed out ({args.budget:.0f} s for the notebook): {str(exc)[:200]}"
    except KeyboardInterrupt:
        timed_out, failure = True, "interrupted by the runner (time budget)"
    except CellExecutionError as exc:
        failure = f"{exc.ename}: {str(exc.evalue)[:300]}"
    except DeadKernelError as exc:
        failure = f"the kernel died: {exc}"
    except Exception as exc:  # reported, and the HTML still written
        failure = f"{type(exc).__name__}: {str(exc)[:300]}"
    seconds = time.monotonic() - start
    found = examine(nb)
    html_bytes = 0
    try:
        body, _ = HTMLExporter().from_notebook_node(nb)
        Path(args.html).write_text(body, encoding="utf-8")
        html_bytes = len(body.encode("utf-8"))
    except Exception as exc:
        failure = failure or f"HTML export failed: {type(exc).__name__}: {exc}"
    problems = ([failure] if failure else []) + found["errors"]
    if found["reports"] == 0 and not failure:
        problems.append("no gpumagic report in the outputs")
    executed = sum(1 for c in nb.cells if c.get("cell_type") == "code" and c.get("execution_count"))
    code_cells = sum(1 for c in nb.cells if c.get("cell_type") == "code")
    detail = (
        f"{executed} of {code_cells} code cells in {seconds:.0f} s, {found['reports']} gpumagic reports, "
        f"HTML {html_bytes / 2**20:.1f} MiB"
    ) + ("; " + "; ".join(problems) if problems else "")
    result = {
        "ok": not problems,
        "timed_out": timed_out,
        "seconds": round(seconds, 1),
        "detail": detail,
        "problems": problems,
        "html_bytes": html_bytes,
        **found,
    }
    Path(args.json).write_text(json.dumps(result))
    print(json.dumps(result), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
