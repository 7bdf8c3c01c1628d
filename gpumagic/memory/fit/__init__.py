"""``%%memfit``'s core (the glue is gpumagic.magics.memfit): will a cell fit on a GPU,
predicted by a dry run on fake tensors, with no real allocation and no GPU needed. What
counts the fake tensors is the tensor census (:mod:`gpumagic.memory.census`), the engine
``%%memtrace`` counts real ones with.

* :mod:`.accounting` - a cell run under the census, its peak by category and module
  (:class:`~.accounting.Accounting`); :mod:`.deeper` what the namespace holds deeper than
  the census looks;
* :mod:`.shadow`, :mod:`.devices`, :mod:`.answers`, :mod:`.dry_run` - one dry run, safely;
  :mod:`.notes` what it approximated;
* :mod:`.gpus`, :mod:`.headroom`, :mod:`.allocator` - the card and what it needs beyond the
  tensors;
* :mod:`.batch`, :mod:`.what_if` - the largest batch, and each fix as a changed dry run;
* :mod:`.result`, :mod:`.api` - :class:`~.result.MemFit`, and ``predict``/``memfit()`` (the
  magic's core, and the same for scripts);
* :mod:`.suggest` - the ``%%memfit`` line that answers "what would fit", which
  ``%%memtrace``'s out-of-memory report ends with.
"""
