"""Memory: the engine both memory magics run on, and the two magics' cores beside each other.
No IPython here (the glue is gpumagic.magics.memtrace and gpumagic.magics.memfit).

* :mod:`.census` - the tensor census: every storage an op makes on one device, from its
  allocation to its free, by category (parameters, gradients, optimizer state, activations,
  temporaries, inputs, other) and by module; the same code on real tensors and on
  ``FakeTensorMode``'s;
* :mod:`.trace` - ``%%memtrace``: a cell run for real, memory accounted to each statement
  through the census and the device's readers, and the out-of-memory post-mortem;
* :mod:`.fit` - ``%%memfit``: a dry run on fake tensors, counted by the census, that predicts
  the CUDA peak, the largest batch and what each fix would save.

``trace`` and ``fit`` both use the census and neither uses the other, with one exception,
named in the import contract of ``pyproject.toml``: the out-of-memory report ends with the
``%%memfit`` line that answers "what would fit" (:mod:`.fit.suggest`).
"""
