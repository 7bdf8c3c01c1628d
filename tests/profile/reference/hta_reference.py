"""Idle-time reference numbers from Holistic Trace Analysis (HTA 0.5.0).

Not a test: run it in a venv that has HTA, outside the project venv:

    python -m venv /tmp/htavenv && /tmp/htavenv/bin/pip install HolisticTraceAnalysis==0.5.0
    /tmp/htavenv/bin/python tests/profile/reference/hta_reference.py ../shared/traces/*.json.gz

It prints, per trace, HTA's ``get_idle_time_breakdown`` (µs per stream and category,
default ``consecutive_kernel_delay`` of 30) for the trace's own rank. The constants in
``tests/profile/test_reference.py`` were copied from its output.

With ``--overlap`` it prints ``get_comm_comp_overlap`` instead (``comp_comm_overlap_pctg``,
the constants of ``tests/profile/test_profile_comms.py``). The project venv holds HTA 0.5.0
too (the ``bench`` extra), so ``.venv/bin/python`` runs it as well.
"""

import json
import logging
import shutil
import sys
import tempfile

logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis  # noqa: E402

overlap = "--overlap" in sys.argv
for path in [a for a in sys.argv[1:] if not a.startswith("--")]:
    directory = tempfile.mkdtemp()
    shutil.copy(path, directory)  # HTA takes a directory of per-rank traces
    analysis = TraceAnalysis(trace_dir=directory)
    rank = analysis.t.get_ranks()[0]
    if overlap:
        frame = analysis.get_comm_comp_overlap(visualize=False)
        pct = float(frame.set_index("rank").loc[rank, "comp_comm_overlap_pctg"])
        print(path.rsplit("/", 1)[-1], json.dumps({"rank": int(rank), "overlap_percent": pct}))
        continue
    idle, _ = analysis.get_idle_time_breakdown(ranks=[rank], visualize=False)
    rows = {f"{int(r.stream)}:{r.idle_category}": float(r.idle_time) for r in idle.itertuples()}
    print(path.rsplit("/", 1)[-1], json.dumps({"rank": int(rank), "idle_us": rows}))
