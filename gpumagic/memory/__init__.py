"""``%%memtrace`` core, no IPython here (the glue is gpumagic.magics.memtrace):

* :mod:`.device` - the traced device: what it is, how ``--device`` resolves, which tensors
  are on it;
* :mod:`.probes` - reading memory at statement boundaries (CUDA allocator, host RSS);
* :mod:`.tracer` - the per-statement accounting, handing out :class:`~.tracer.TraceTotals`;
* :mod:`.holders` - who holds memory, by the names the namespace gives;
* :mod:`.oom` - the out-of-memory post-mortem and its report;
* :mod:`.report` - the result (:class:`~.report.MemTrace`);
* :mod:`.run` - one traced cell through :func:`gpumagic.cell.run_measured`;
* :mod:`.fit` - ``%%memfit``: a dry run on fake tensors that predicts the CUDA peak, the
  largest batch and what each fix would save.
"""
