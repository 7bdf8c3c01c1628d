"""A notebook as someone else would receive it: ``%%memtrace``, ``%%gpuprofile`` and
``%gpuwatch`` run in a real kernel (nbclient, which applies the live views' display updates
as a front end does), then saved with nbformat, unsigned: opened anywhere but the machine
that ran it, every cell is untrusted, so its HTML is sanitised.

Used by the browser test (JupyterLab and Notebook 7 open it) and by the conversion test
(``nbconvert --to markdown`` / ``latex``).
"""

from __future__ import annotations

from pathlib import Path

CELLS = [
    "%load_ext gpumagic",
    "%gpuwatch -i 0.2",
    "import torch\n"
    "from torch import nn\n"
    "torch.manual_seed(0)\n"
    "model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)",
    "%%memtrace\n"
    "x = torch.randn(512, 256)\n"
    "big = torch.ones(2**23)\n"
    "loss = model(x).sum()\n"
    "loss.backward()\n"
    "del big",
    "%%gpuprofile -n shared\n"
    "import gpumagic\n"
    "for _ in range(4):\n"
    "    loss = model(torch.randn(64, 256)).sum()\n"
    "    loss.backward(); opt.step(); opt.zero_grad()\n"
    "    gpumagic.step()",
    "import time\n"
    "t_end = time.time() + 1.5\n"
    "while time.time() < t_end:\n"
    "    sum(i * i for i in range(2000))",
    "%gpuwatch stop",
]
# Cell indexes of what the tests look at.
WATCH_START, MEMTRACE, PROFILE, WATCH_STOP = 1, 3, 4, 6
TIMEOUT_S = 300


def execute(path: Path) -> Path:
    """Run :data:`CELLS` in a python3 kernel (working directory: ``path``'s folder) and save
    the notebook, outputs included and unsigned, at ``path``."""
    import nbclient
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    client = nbclient.NotebookClient(
        nb, timeout=TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    nbformat.write(nb, path)
    return path


def html_outputs(nb: object, index: int) -> list[str]:
    """The ``text/html`` of cell ``index``'s outputs."""
    cell = nb.cells[index]  # type: ignore[attr-defined]
    return [o["data"]["text/html"] for o in cell.get("outputs", []) if "text/html" in o.get("data", {})]
