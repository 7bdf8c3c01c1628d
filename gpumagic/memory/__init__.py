"""``%%memtrace`` core: memory probes (CUDA allocator, host RSS), the per-statement
tracer, the out-of-memory report. No IPython here; the glue is gpumagic.magics.memtrace."""
