"""Every rich output of a cell, as a notebook gets them: display() bundles, then Out[].

The ``run`` fixture captures ``display()`` calls, but a cell's value reaches the front end
through the shell's displayhook (ipykernel sends it as ``execute_result``), which the
terminal test shell only prints as text. :func:`run_showing` swaps in a displayhook that
keeps the whole format dict, so a test can check that a line magic's result is shown
once, with its HTML, and that a trailing ``;`` shows nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from IPython.core.displayhook import DisplayHook


class KeepingDisplayHook(DisplayHook):
    """The standard displayhook (Out[] cache, ``_``, ``;`` handling), keeping each bundle."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell=shell, cache_size=shell.cache_size)
        self.bundles: list[dict[str, Any]] = []

    def write_output_prompt(self) -> None:
        pass

    def write_format_data(self, format_dict: dict[str, Any], md_dict: Any = None) -> None:
        self.bundles.append(format_dict)


class Outputs:
    """A cell's run (``.result``, ``.stdout``), its ``display()`` bundles and its ``Out[]``."""

    def __init__(self, run: Any, out: list[dict[str, Any]]) -> None:
        self.run = run
        self.result = run.result
        self.stdout = run.stdout
        self.displayed: list[dict[str, Any]] = run.bundles
        self.out = out

    @property
    def value(self) -> Any:
        """What IPython made of the last line: the Out[] value, None when nothing showed."""
        return self.result.result

    @property
    def bundles(self) -> list[dict[str, Any]]:
        return self.displayed + self.out

    def html(self) -> str:
        return "".join(b.get("text/html", "") for b in self.bundles)

    def plain(self) -> str:
        return "".join(b.get("text/plain", "") for b in self.bundles)

    def reports(self, kind: str) -> list[dict[str, Any]]:
        """The bundles holding a gpumagic report of ``kind`` (``profile``, ``env``...)."""
        css = f'class="gpumagic gpumagic-{kind}"'
        return [b for b in self.bundles if css in b.get("text/html", "")]


def run_showing(ip: Any, run: Callable[[str], Any], cell: str) -> Outputs:
    hook = KeepingDisplayHook(ip)
    saved = ip.displayhook, ip.display_trap.hook
    # run_cell hands its ExecutionResult to shell.displayhook; the trap installs it as
    # sys.displayhook while the cell runs. Both must be the keeping one.
    ip.displayhook = ip.display_trap.hook = hook
    try:
        r = run(cell)
    finally:
        ip.displayhook, ip.display_trap.hook = saved
    return Outputs(r, hook.bundles)
