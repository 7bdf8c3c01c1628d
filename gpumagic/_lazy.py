"""Public names resolved on first use, so that importing a package stays cheap.

``%load_ext gpumagic`` and ``import gpumagic.profile`` must not pull in torch, numpy or
pandas (they cost most of a second); a package lists what it offers and where it lives,
and the module is imported only when one of its names is first read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, names: Mapping[str, tuple[str, str]], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``names`` maps a public name to
    (module, attribute); a name read once is kept in ``namespace`` (the package's globals)."""

    def __getattr__(name: str) -> Any:
        try:
            module, attr = names[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), attr)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
