"""The tensor census (filled in by the next commit)."""
