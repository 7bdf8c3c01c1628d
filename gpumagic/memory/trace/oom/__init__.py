"""The out-of-memory post-mortem of %%memtrace (laid out by job in the next commit)."""
