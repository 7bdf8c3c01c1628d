"""The diagnosis: findings over an :class:`~gpumagic.profile.analysis.Analysis`, ranked by
the time each would save."""

from __future__ import annotations

from gpumagic._lazy import lazy_exports

_LAZY = {
    "Finding": ("gpumagic.profile.rules.base", "Finding"),
    "diagnose": ("gpumagic.profile.rules.registry", "diagnose"),
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
