"""Step-time breakdown reference numbers from the PyTorch Profiler TensorBoard plugin.

Not a test: run it in a venv holding torch-tb-profiler 0.4.3 (its last PyPI release),
outside the project venv:

    python -m venv /tmp/tbvenv && /tmp/tbvenv/bin/pip install torch-tb-profiler==0.4.3
    /tmp/tbvenv/bin/python tests/profile/reference/tb_plugin_reference.py TRACE...
    /tmp/tbvenv/bin/python tests/profile/reference/tb_plugin_reference.py --normalize TRACE...

It prints the plugin's averaged step-time breakdown (percent per role), mean step time,
GPU utilisation, estimated SM efficiency and achieved occupancy, as its overview page
shows them. The constants in ``tests/profile/test_reference.py`` were copied from it.

The plugin predates Kineto's newer category names: it maps `cuda_runtime` to nothing and
drops `user_annotation` spans other than ProfilerStep, so on new-schema traces it reports
Runtime 0 and never sees DataLoader spans. --normalize rewrites those categories to the old
names the plugin understands (cpu_op/user_annotation -> Operator, cuda_runtime/cuda_driver ->
Runtime, kernel -> Kernel, gpu_memcpy -> Memcpy, gpu_memset -> Memset, drops
gpu_user_annotation) before handing the trace to the plugin's own parser.

--comm-kernels-by-name (issue 11) changes one thing in the plugin: which events are
communication. The plugin links NCCL kernels to their ``nccl:*`` CPU op through the
External id, which on Kineto traces where the launch carries External id = correlation id
finds none, so NCCL kernels count as Kernel. In this mode a kernel is communication when
its name says so (``nccl*Kernel*``, as HTA classifies them), it no longer counts towards GPU
utilisation, SM efficiency or occupancy, and the ``nccl:*`` CPU spans (which only enqueue the
kernels) are CPU ops; ``gloo:*`` spans stay communication. The plugin's priority order,
step rules and Distributed View are untouched; the mode also prints that view per step
(computation, overlap, communication, other, as the plugin's costs hold them).
"""

import gzip
import json
import logging
import sys

logging.disable(logging.CRITICAL)
from torch_tb_profiler.profiler.data import RunProfileData  # noqa: E402
from torch_tb_profiler.profiler.event_parser import ProfileRole  # noqa: E402

RENAME = {
    "cpu_op": "Operator",
    "user_annotation": "Operator",
    "cuda_runtime": "Runtime",
    "cuda_driver": "Runtime",
    "kernel": "Kernel",
    "gpu_memcpy": "Memcpy",
    "gpu_memset": "Memset",
}
ROLES = ["Kernel", "Memcpy", "Memset", "Communication", "Runtime", "DataLoader", "CpuOp", "Other"]


def load(path, normalize):
    with gzip.open(path) if path.endswith(".gz") else open(path) as f:
        trace = json.load(f)
    if normalize:
        events = []
        for e in trace["traceEvents"]:
            cat = e.get("cat")
            if cat == "gpu_user_annotation":
                continue
            if cat in RENAME:
                e = dict(e, cat=RENAME[cat])
            events.append(e)
        trace["traceEvents"] = events
    return trace


normalize = "--normalize" in sys.argv
by_name = "--comm-kernels-by-name" in sys.argv
if by_name:
    import re

    from torch_tb_profiler.profiler import event_parser, gpu_metrics_parser
    from torch_tb_profiler.profiler.trace import EventTypes, NcclOpNameSet

    COMM_KERNEL = re.compile(r"^(?:void )?(?:nccl|rccl)\w*Kernel")
    _parse_step = event_parser.StepParser._parse_step
    _parse_kernel = gpu_metrics_parser.GPUMetricsParser.parse_event

    def parse_step(self, event, comm_nodes):
        ts, dur = event.ts, event.duration
        if event.type == EventTypes.KERNEL and COMM_KERNEL.match(event.name):
            self.role_ranges[ProfileRole.Communication].append((ts, ts + dur))
            self.global_min_ts = min(self.global_min_ts, ts)
            self.global_max_ts = max(self.global_max_ts, ts + dur)
            return
        if event.type == EventTypes.KERNEL:
            comm_nodes = {}  # no External-id lookup: a kernel is communication by name only
        if event.name in NcclOpNameSet:
            self.role_ranges[ProfileRole.CpuOp].append((ts, ts + dur))
            if event.type in (EventTypes.PYTHON, EventTypes.OPERATOR):
                self.cpu_min_ts = min(self.cpu_min_ts, ts)
                self.cpu_max_ts = max(self.cpu_max_ts, ts + dur)
            self.global_min_ts = min(self.global_min_ts, ts)
            self.global_max_ts = max(self.global_max_ts, ts + dur)
            return
        _parse_step(self, event, comm_nodes)

    def parse_kernel(self, event):
        if not COMM_KERNEL.match(event.name):
            _parse_kernel(self, event)

    event_parser.StepParser._parse_step = parse_step
    gpu_metrics_parser.GPUMetricsParser.parse_event = parse_kernel
for path in [a for a in sys.argv[1:] if not a.startswith("--")]:
    data = RunProfileData.from_json("worker", "span", load(path, normalize))
    costs = data.avg_costs.costs
    total = costs[ProfileRole.Total]
    row = {role: round(100 * costs[i] / total, 3) for i, role in enumerate(ROLES)}
    row["step_us"] = round(total, 1)
    row["steps"] = list(data.steps_names)
    util = [u for u in data.gpu_metrics_parser.gpu_utilization if u is not None]
    row["gpu_util"] = [round(100 * u, 3) for u in util]
    sm = [
        u
        for u in data.gpu_metrics_parser.avg_approximated_sm_efficiency_per_device
        if u is not None
    ]
    row["sm_efficiency"] = [round(100 * u, 3) for u in sm]
    occ = [u for u in data.gpu_metrics_parser.avg_occupancy_per_device if u is not None]
    row["occupancy"] = [round(u, 3) for u in occ]
    if by_name:
        row["distributed_view"] = [
            [
                round(c.computation, 1),
                round(c.overlap, 1),
                round(c.communication, 1),
                round(c.other, 1),
            ]
            for c in data.comm_overlap_costs
        ]
    print(
        path.rsplit("/", 2)[-1]
        if "two_ranks" not in path
        else "two_ranks/" + path.rsplit("/", 1)[-1],
        json.dumps(row),
    )
