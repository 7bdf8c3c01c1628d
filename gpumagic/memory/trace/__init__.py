"""``%%memtrace`` (filled in by the next commit)."""
