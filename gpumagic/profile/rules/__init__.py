"""The diagnosis: findings over an :class:`~gpumagic.profile.analysis.Analysis`, ranked by
the time each would save.

* :mod:`.base` - :class:`~.base.Finding`, :class:`~.base.Context` (what detections read),
  :class:`~.base.Evidence`, :class:`~.base.Facts`, :class:`~.base.Advice`,
  :class:`~.base.Rule` and the severities;
* :mod:`.registry` - ``RULES``, every rule by name, and :func:`~.registry.diagnose`, which
  runs them, ranks what they find and points each finding at its line of the cell.

One module per family of rules:

* :mod:`.input_pipeline` - feeding the GPU: ``dataloader``, ``pageable_memcpy``;
* :mod:`.sync_launch` - the host holding the GPU back: ``sync``, ``launch_bound``;
* :mod:`.precision` - matmuls and convolutions off the tensor cores: ``tensor_cores``;
* :mod:`.kernels_memory` - kernels and device memory: ``low_utilization``, ``small_grid``,
  ``memory_ceiling``, ``cudnn_benchmark``;
* :mod:`.optimizer` - the optimizer step: ``optimizer``, ``zero_grad``;
* :mod:`.communication` - multi-GPU: ``communication``, ``dataparallel``, ``gloo_on_gpu``.

A new rule goes in the module of its family (a new module when none fits), as two
functions side by side:

1. ``detect_<rule>(c: Context) -> <Evidence subclass> | None``: reads the analysis (and
   ``c.live`` to confirm or rule out what the trace hints) and returns a frozen dataclass
   derived from :class:`~.base.Evidence`: the saving per step, the trace rows behind it
   (which point the finding at a line), its own numbers and flags, and ``quoted()``, the
   numbers the finding quotes. No prose here; numbers that belong in the analysis (a mask
   other rules or reports could use) go to :mod:`gpumagic.profile.analysis` instead.
2. ``advise_<rule>(evidence, facts: Facts) -> Advice``: the title, message, fix and code
   snippet, fitted to the :class:`~.base.Facts` (the live session; the CPUs this process may
   use, the GPU's compute capability, the installed torch), so the snippet runs as written
   on the machine it is for. Every number the message quotes must be one ``quoted()``
   holds (``tests/profile/test_profile_findings_text.py`` checks it on every shared trace).

Then register it: ``Rule("<rule>", detect_<rule>, advise_<rule>)`` in ``registry.RULES``
(with ``category=`` the breakdown category its saving is time of, where there is one: a
comparison then calls it fixed only when that category moved beyond the noise);
and test it on a real trace from ``../shared/traces`` that shows the problem, or on one
built in the test from a few events (``tests/profile/profile_helpers.TraceBuilder``) where
no real trace does, both where it fires and where it must stay silent.
"""

from __future__ import annotations

from gpumagic._lazy import lazy_exports

_LAZY = {
    "Finding": ("gpumagic.profile.rules.base", "Finding"),
    "diagnose": ("gpumagic.profile.rules.registry", "diagnose"),
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
