"""The out-of-memory post-mortem of ``%%memtrace``, one job a module:

* :mod:`.detect` - which memory ran out (CUDA or the host), on which device, and how much
  was asked for, read from the error itself;
* :mod:`.holders` - who holds the memory, by the names the namespace gives
  (``model.fc.weight.grad``), the failing call's locals, and what no name reaches;
* :mod:`.release` - the release of the failed call's frames, which frees what they held;
* :mod:`.model` - :class:`~.model.OomReport`, the report as data;
* :mod:`.analyse` - from the allocator's statistics, ``/proc`` and the holders to the report;
* :mod:`.advice` - what to try, most specific first;
* :mod:`.memfit_line` - the ``%%memfit`` line the report ends with (the one use of
  ``%%memfit`` by ``%%memtrace``, named in the import contract);
* :mod:`.postmortem` - all of it in order, once, when a traced cell ran out of memory
  (:func:`~.postmortem.post_mortem`).
"""
