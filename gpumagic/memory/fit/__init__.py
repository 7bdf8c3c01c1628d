"""``%%memfit`` core (the glue is gpumagic.magics.memfit): will a cell fit on a GPU, predicted
by a dry run on fake tensors, with no real allocation and no GPU needed.

* :mod:`.accounting` - a cell run under issue 16's tensor census (:mod:`gpumagic.memory.census.tracker`,
  the engine ``%%memtrace`` counts with), its peak by category and module; :mod:`.deeper`
  what the namespace holds deeper than the census looks; :mod:`.measure` the same census on
  real tensors, the measured exact peak a prediction is checked against;
* :mod:`.shadow`, :mod:`.devices`, :mod:`.answers`, :mod:`.dry_run` - one dry run, safely;
* :mod:`.gpus`, :mod:`.headroom`, :mod:`.allocator` - the card and what it needs beyond the
  tensors;
* :mod:`.batch`, :mod:`.what_if` - the largest batch, and each fix as a changed dry run;
* :mod:`.result`, :mod:`.api` - :class:`~.result.MemFit`, and ``memfit()`` for scripts.
"""
