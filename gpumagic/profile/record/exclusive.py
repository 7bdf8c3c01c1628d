"""torch runs one profiler per process: who holds it, handing it over to the cell, and the
profile function its Python tracer takes from the user (``--with-stack``).

Kineto keeps one profiling session per process. A second profiler started while one runs
replaces its session, and the first one's stop then finds none: torch warns
"disableProfiler called but no active profiling session found", returns an empty result,
and ``export_chrome_trace`` on it crashes the process (a segfault in torch 2.13's
``_ProfilerResult.save``; reproduced with two plain ``torch.profiler.profile`` objects,
no gpumagic involved). So:

* before ``%%gpuprofile`` starts, :func:`running_profiler` says whether a profiler is on
  (the user's ``prof.start()`` of an earlier cell, an open ``with`` block, ``emit_nvtx``),
  naming it when the namespace holds it: the magic refuses rather than end it;
* while the cell runs, :class:`Handover` watches torch's own entry points for starting a
  profiler (``_prepare_profiler``, ``_run_on_profiler_start``, the legacy profiler's
  ``_enable_profiler_legacy``, the module globals every torch profiler calls when it
  starts). The first call from the cell stops gpumagic's recording cleanly at that moment
  (the trace so far is written) before the cell's profiler starts, so the cell's profiler
  works as it would without the magic, and nothing stops a session twice.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from gpumagic.namespace import is_a, user_items

__all__ = ["Handover", "restore_profile_function", "running_profiler"]

# (module, attribute): the calls every torch profiler makes as it starts (torch 2.x)
_ENTRY_POINTS = (
    ("torch.autograd.profiler", "_prepare_profiler"),
    ("torch.autograd.profiler", "_run_on_profiler_start"),
    ("torch.autograd.profiler_legacy", "_enable_profiler_legacy"),
)


def running_profiler(namespace: Mapping[str, Any]) -> str | None:
    """Why ``%%gpuprofile`` cannot start now, in words: a torch profiler is on in this
    process (named when the namespace holds it, started or prepared for a schedule's
    warm-up); None when none is."""
    import torch

    names = sorted(_held_profilers(torch, namespace))
    try:
        enabled = bool(torch.autograd._profiler_enabled())
    except Exception:
        enabled = False
    if not names and not enabled:
        return None
    if names:
        who = " and ".join(f"`{n}`" for n in names)
        what = f"the torch profiler {who} of this notebook is running"
        stop = f"stop it first ({names[0]}.stop())"
    else:
        what = (
            "a torch profiler is running in this process (an open `with torch.profiler."
            "profile()` block, a profiler a script or a library started, emit_nvtx)"
        )
        stop = "stop that one first"
    return (
        f"{what}. torch runs one profiler per process, and profiling this cell would end "
        f"it; {stop}, or run the cell without %%gpuprofile"
    )


def _held_profilers(torch: Any, namespace: Mapping[str, Any]) -> list[str]:
    """Names of the namespace's torch profilers that hold torch's profiler now: started
    (or prepared for a warm-up step) and not stopped. Read by the namespace's rules
    (:mod:`gpumagic.namespace`): a user object whose ``__class__`` raises must not fail this."""
    kineto = getattr(getattr(torch, "profiler", None), "profiler", None)
    kinds = tuple(
        k
        for k in (
            getattr(kineto, "_KinetoProfile", None),
            getattr(getattr(torch.autograd, "profiler", None), "profile", None),
        )
        if isinstance(k, type)
    )
    if not kinds:
        return []
    names = []
    for name, value in user_items(namespace):
        if not is_a(value, kinds):
            continue
        inner = getattr(value, "profiler", value)  # torch.profiler.profile wraps the autograd one
        if inner is None or not issubclass(type(inner), kinds):
            continue
        try:
            if inner.entered and inner.kineto_results is None and not _finished(inner):
                names.append(name)
        except AttributeError:
            continue
    return names


def _finished(autograd_profile: Any) -> bool:
    # torch sets the window's end when the profiler stops
    return bool(getattr(autograd_profile, "profiling_end_time_ns", 0))


class Handover:
    """While installed, the first start of a torch profiler by anyone but the owner calls
    ``before_start()`` first (on that thread), then uninstalls itself and lets the start
    proceed; the owner's own starts (a schedule's steps) run inside :meth:`owner`."""

    def __init__(self, before_start: Callable[[], None]) -> None:
        self._before_start = before_start
        self._saved: list[tuple[Any, str, Any, Any]] = []  # module, name, original, wrapper
        self._lock = threading.Lock()
        self._owner_calls = 0
        self.handed_over = False

    def install(self) -> None:
        for module_name, attr in _ENTRY_POINTS:
            module = sys.modules.get(module_name)
            original = getattr(module, attr, None) if module is not None else None
            if original is None:
                continue
            wrapper = self._wrap(original)
            self._saved.append((module, attr, original, wrapper))
            setattr(module, attr, wrapper)

    def remove(self) -> None:
        """Put torch's functions back (a no-op the second time)."""
        saved, self._saved = self._saved, []
        for module, attr, original, wrapper in saved:
            if getattr(module, attr, None) is wrapper:  # else someone wrapped ours: it goes inert
                setattr(module, attr, original)

    @contextmanager
    def owner(self) -> Iterator[None]:
        self._owner_calls += 1
        try:
            yield
        finally:
            self._owner_calls -= 1

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def start(*args: Any, **kwargs: Any) -> Any:
            if self._saved and not self._owner_calls:
                with self._lock:
                    first = not self.handed_over
                    self.handed_over = True
                if first:
                    try:
                        self._before_start()
                    finally:
                        self.remove()
            return original(*args, **kwargs)

        return start


def restore_profile_function(saved: Any) -> str:
    """Set ``saved`` (what ``sys.getprofile()`` gave before a ``with_stack`` profiler
    started) again where the profile function is now unset: torch's Python tracer replaces
    this thread's function while it records and clears it when it stops. Returns its name,
    or "" when nothing was set. A ``cProfile.Profile`` is no callable (it installs a C-level
    function): it is enabled again instead."""
    if sys.getprofile() is not None:
        return ""  # the cell set one of its own: it stays
    try:
        if callable(saved):
            sys.setprofile(saved)
        else:
            saved.enable()
    except Exception:
        return ""
    return getattr(saved, "__qualname__", None) or type(saved).__name__
