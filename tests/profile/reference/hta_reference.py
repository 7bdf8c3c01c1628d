"""Idle-time reference numbers from Holistic Trace Analysis (HTA 0.5.0).

Not a test: run it in a venv that has HTA, outside the project venv:

    python -m venv /tmp/htavenv && /tmp/htavenv/bin/pip install HolisticTraceAnalysis==0.5.0
    /tmp/htavenv/bin/python tests/profile/reference/hta_reference.py ../shared/traces/*.json.gz

It prints, per trace, HTA's ``get_idle_time_breakdown`` (µs per stream and category,
default ``consecutive_kernel_delay`` of 30) for the trace's own rank. The constants in
``tests/profile/test_reference.py`` were copied from its output.
"""

import json
import logging
import shutil
import sys
import tempfile

logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis  # noqa: E402

for path in sys.argv[1:]:
    directory = tempfile.mkdtemp()
    shutil.copy(path, directory)  # HTA takes a directory of per-rank traces
    analysis = TraceAnalysis(trace_dir=directory)
    rank = analysis.t.get_ranks()[0]
    idle, _ = analysis.get_idle_time_breakdown(ranks=[rank], visualize=False)
    rows = {f"{int(r.stream)}:{r.idle_category}": float(r.idle_time) for r in idle.itertuples()}
    print(path.rsplit("/", 1)[-1], json.dumps({"rank": int(rank), "idle_us": rows}))
