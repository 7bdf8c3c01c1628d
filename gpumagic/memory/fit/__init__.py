"""``%%memfit`` core (the glue is gpumagic.magics.memfit): will a cell fit on a GPU, predicted
by a dry run on fake tensors, with no real allocation and no GPU needed.

* :mod:`.accounting` - what a dry run asks of an accounting engine, as a narrow interface;
  :mod:`.storage_tracker` the engine behind it for now;
* :mod:`.shadow`, :mod:`.devices`, :mod:`.answers`, :mod:`.dry_run` - one dry run, safely;
* :mod:`.gpus`, :mod:`.headroom`, :mod:`.allocator` - the card and what it needs beyond the
  tensors;
* :mod:`.batch`, :mod:`.what_if` - the largest batch, and each fix as a changed dry run;
* :mod:`.result`, :mod:`.api` - :class:`~.result.MemFit`, and ``memfit()`` for scripts.
"""
