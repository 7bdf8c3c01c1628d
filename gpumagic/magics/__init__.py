"""IPython glue: ``%load_ext gpumagic`` registers every magic here; unloading undoes it all.

Each feature has its own ``Magics`` class in a sibling module; they parse arguments,
call the core through the shared cell runner (:mod:`gpumagic.cell`) and display the
result. Anything a magic starts that outlives a cell (event callbacks, sampler threads)
registers a cleanup with :func:`on_unload` so ``%unload_ext gpumagic`` stops it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

# (module, class) of every Magics class the extension registers, in order.
MAGIC_CLASSES: list[tuple[str, str]] = [
    ("gpumagic.magics.memtrace", "MemtraceMagics"),
    ("gpumagic.magics.memfit", "MemfitMagics"),
    ("gpumagic.magics.profile", "ProfileMagics"),
    ("gpumagic.magics.watch", "WatchMagics"),
    ("gpumagic.magics.env", "EnvMagics"),
    ("gpumagic.magics.select", "SelectMagics"),
    ("gpumagic.magics.gpucheck", "GpuCheckMagics"),
]

_cleanups: list[Callable[[], object]] = []
_registered: dict[int, list[tuple[str, str]]] = {}


def on_unload(fn: Callable[[], object]) -> None:
    """Run ``fn`` when the extension is unloaded (stop threads, unregister events)."""
    _cleanups.append(fn)


def load(shell: Any) -> None:
    from gpumagic.cell import install_syntax_error_display

    names: list[tuple[str, str]] = []
    for module, cls in MAGIC_CLASSES:
        magics_cls = getattr(importlib.import_module(module), cls)
        instance = magics_cls(shell)
        shell.register_magics(instance)
        for kind, table in instance.magics.items():
            names.extend((kind, name) for name in table)
    _registered[id(shell)] = names
    on_unload(install_syntax_error_display(shell))


def unload(shell: Any) -> None:
    while _cleanups:
        fn = _cleanups.pop()
        try:
            fn()
        except Exception:  # one failing cleanup must not keep the others from running
            pass
    magics = shell.magics_manager.magics
    for kind, name in _registered.pop(id(shell), []):
        magics.get(kind, {}).pop(name, None)
