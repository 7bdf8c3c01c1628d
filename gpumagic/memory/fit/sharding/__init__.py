"""``%%memfit`` across many GPUs: one rank's peak under DDP, FSDP2 and DeepSpeed ZeRO 1/2/3,
modelled on the cell's own step rather than on totals (issue 26).

* :mod:`.units` - the wrapping policy: which modules are gathered together;
* :mod:`.record` - the recording dry run: marks where a sharded run acts, in the census's
  sequence of allocations and frees;
* :mod:`.modes`, :mod:`.machines` - what each mode holds and allocates, and when, with the
  torch, DeepSpeed and paper sources of each rule;
* :mod:`.replay` - one rank's timeline and peak for a mode and N;
* :mod:`.fit` - the ``--gpus N --shard MODE`` answer, the smallest card, the smallest N for a
  card.
"""
