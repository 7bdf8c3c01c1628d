"""``%%memtrace`` core, no IPython here (the glue is gpumagic.magics.memtrace):

* :mod:`.device` - the traced device: what it is, how ``--device`` resolves, which tensors
  are on it;
* :mod:`.probes` - reading memory at statement boundaries (CUDA allocator, host RSS);
* :mod:`.categories` - where tensor memory goes: parameters, gradients, optimizer state,
  activations, temporaries, inputs, other;
* :mod:`.tensors` - the tensor census: every storage on the traced device by category
  (:mod:`.dispatch` its dispatch mode, :mod:`.reach` what the namespace reaches,
  :mod:`.ledger` the running account, replayed to each statement's peak); the same code
  runs on ``FakeTensorMode`` tensors;
* :mod:`.tracer` - the per-statement accounting, handing out :class:`~.tracer.TraceTotals`;
* :mod:`.holders` - who holds memory, by the names the namespace gives;
* :mod:`.oom` - the out-of-memory post-mortem and its report;
* :mod:`.report` - the result (:class:`~.report.MemTrace`); :mod:`.timeline` its memory over
  time and at the peak; :mod:`.viz` the export for PyTorch's memory visualiser;
* :mod:`.run` - one traced cell through :func:`gpumagic.cell.run_measured`;
* :mod:`.fit` - ``%%memfit``: a dry run on fake tensors that predicts the CUDA peak, the
  largest batch and what each fix would save.
"""
