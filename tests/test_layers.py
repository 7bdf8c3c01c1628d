"""The one-way rule in what import-linter cannot see: renderers read public attributes only.

The import contracts (``[tool.importlinter]`` in pyproject.toml, run by ``make lint``) keep
the cores from importing the front end. What a renderer reads of the objects it is handed is
no import, so this walks ``gpumagic/render`` for ``obj._name`` on anything but ``self`` and
``cls`` (issue 8: ``render/watch.py`` used to keep its frame cache in ``watcher._render_cache``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import gpumagic.render

RENDER = Path(gpumagic.render.__file__).parent
# Public by convention although they start with "_": namedtuple's API, IPython's display hooks.
PUBLIC = re.compile(r"_(asdict|replace|fields|make)$|_repr_\w+_$|_ipython_\w+_$")


def private_reads(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        if PUBLIC.match(name):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        found.append((node.lineno, f"{ast.unparse(node.value)}.{name}"))
    return found


def test_the_check_sees_a_private_read() -> None:
    assert private_reads("def f(w):\n    return w._render_cache\n") == [(2, "w._render_cache")]
    assert private_reads("def f(self, row):\n    return self._x, row._asdict()\n") == []


def test_renderers_read_public_attributes_only() -> None:
    files = sorted(RENDER.glob("*.py"))
    assert len(files) >= 5  # the folder was found
    offences = {
        f.name: reads for f in files if (reads := private_reads(f.read_text(encoding="utf-8")))
    }
    assert offences == {}
