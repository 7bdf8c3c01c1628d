"""Each magic's CUDA path as real cells, asserting on what the GPU produced (``gpu_check.py``'s
"cells" part; run on its own: ``python3 tools/gpu_cells.py --json cells.jsonl``).

The cells run in one IPython ``InteractiveShell`` with gpumagic loaded, as a user's would:

  gpuenv                %gpuenv: the GPU name is torch's, CUDA still uninitialised after it
  gpuwatch              %gpuwatch with NVML: real samples, this process's GPU memory found
  memtrace_resnet       %%memtrace on a ResNet-18 training step: the allocator's exact bytes, and
                        the tensor census's categories (activations, gradients, momentum) on CUDA
  gpuprofile_slow_loop  %%gpuprofile on a deliberately slow loop: dataloader, pageable_memcpy,
                        sync and tensor_cores must fire
  memtrace_oom          a real CUDA out-of-memory error (a plain cudaMalloc far beyond the
                        card), the report, and the memory coming back to its baseline
  memfit_resnet         %%memfit's dry run of a ResNet-18 training step against the real
                        step's torch.cuda.max_memory_allocated(): within 10%
  gpucheck              %gpucheck on the lent card: NVML read it (and again under load), it has
                        a specification, and each measured figure lies within a plausible range
                        of the specification's, whose source is printed beside it

One JSON line per check goes to ``--json`` as soon as it is known (so a timeout keeps what
was done): ``{"name", "status", "seconds", "detail", "data"}``. Without CUDA every GPU check
is reported "not on a GPU", never run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MiB, GiB = 2**20, 2**30
PER_CHECK_S = 45.0


class Failed(AssertionError):
    """A check's assertion did not hold."""


class CheckTimeout(Exception):
    """The check ran past its own time limit (SIGALRM)."""


def expect(cond: object, message: str) -> None:
    if not cond:
        raise Failed(message)


class Cells:
    """The shell, and ``run(cell)`` -> (ExecutionResult, stdout, html) with outputs captured."""

    def __init__(self) -> None:
        from IPython.core.interactiveshell import InteractiveShell

        self.shell = InteractiveShell.instance()
        r = self.shell.run_cell("%load_ext gpumagic", store_history=False)
        if not r.success:
            raise RuntimeError(f"%load_ext gpumagic failed: {r.error_in_exec!r}")
        self.ns = self.shell.user_ns

    def run(self, cell: str) -> tuple[Any, str, str]:
        from IPython.utils.capture import capture_output

        with capture_output() as cap:
            r = self.shell.run_cell(cell, store_history=True)
        if isinstance(r.error_in_exec, CheckTimeout) or isinstance(r.error_before_exec, CheckTimeout):
            raise CheckTimeout("ran out of time inside a cell")
        html = "".join(o.data.get("text/html", "") for o in cap.outputs)
        return r, cap.stdout, html

    def ok(self, cell: str) -> tuple[Any, str, str]:
        r, out, html = self.run(cell)
        if not r.success:
            err = r.error_in_exec or r.error_before_exec
            raise Failed(f"cell failed: {type(err).__name__}: {err}\n{cell}")
        return r, out, html


CHECKS: list[tuple[str, Callable[[Cells], tuple[str, dict[str, Any]]]]] = []


def check(name: str) -> Callable[[Callable[[Cells], tuple[str, dict[str, Any]]]], Any]:
    def register(fn: Callable[[Cells], tuple[str, dict[str, Any]]]) -> Any:
        CHECKS.append((name, fn))
        return fn

    return register


@check("gpuenv")
def gpuenv(c: Cells) -> tuple[str, dict[str, Any]]:
    import torch

    from gpumagic.render.html import escape

    before = torch.cuda.is_initialized()
    _, _, html = c.ok("e = %gpuenv")
    after = torch.cuda.is_initialized()
    expect(before or not after, "%gpuenv initialised torch's CUDA state (ran _lazy_init)")
    e = c.ns["e"]
    expect(e.cuda_available, f"the report says CUDA is not available: {e.gpu_summary}")
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    expect(e.gpus, "no GPUs in the report")
    expect(e.gpus[0].name == names[0], f"report's GPU {e.gpus[0].name!r}, torch's {names[0]!r}")
    total = torch.cuda.get_device_properties(0).total_memory
    got = e.gpus[0].total_memory
    expect(got and abs(got - total) <= 0.05 * total, f"report's memory {got}, torch's {total}")
    expect(e.driver.present and e.driver.version, f"no driver version: {e.driver}")
    expect(e.cuda_runtime == torch.version.cuda, f"CUDA runtime {e.cuda_runtime}, torch built with {torch.version.cuda}")
    expect(escape(names[0]) in html, "the GPU's name is not in the HTML report")
    detail = (
        f"{e.gpus[0].name} ({e.gpus[0].source}), driver {e.driver.version}, CUDA {e.cuda_runtime}, "
        f"cuDNN {e.cudnn}; CUDA uninitialised before and after %gpuenv: {not before and not after}"
    )
    return detail, {"gpus": [g.name for g in e.gpus], "driver": e.driver.version, "m1_untouched": not after}


@check("gpuwatch")
def gpuwatch(c: Cells) -> tuple[str, dict[str, Any]]:
    import torch

    c.ok("%gpuwatch -i 0.1")
    c.ok(
        "import time, torch\n"
        "held = torch.empty(2**30, dtype=torch.uint8, device='cuda')  # 1 GiB this process holds\n"
        "a = torch.randn(8192, 8192, device='cuda')\n"
        "t0 = time.perf_counter()\n"
        "while time.perf_counter() - t0 < 2.0:\n"
        "    b = a @ a\n"
        "    torch.cuda.synchronize()\n"
    )
    c.ok("time.sleep(0.3)")
    c.ok("w = %gpuwatch stop")
    w = c.ns["w"]
    expect(w.reason is None, f"not watching NVML: {w.reason}")
    s = w.samples
    gpu = s[s["device"] != "host"]
    name = torch.cuda.get_device_name(0)
    first = gpu[gpu["cuda_index"] == 0]
    expect(len(first) >= 10, f"{len(first)} samples of cuda:0 in about 2.5 s at 0.1 s")
    expect((first["name"] == name).all(), f"names {set(first['name'])}, torch's {name!r}")
    total = torch.cuda.get_device_properties(0).total_memory
    expect(abs(first["memory_total"].iloc[-1] - total) <= 0.05 * total, "NVML's total memory is not torch's")
    own = float(first["process_memory_used"].max())
    expect(own == own and own >= GiB, f"this process's GPU memory not found (max {own}); notes: {w.notes}")
    cells = w.cells
    work = cells[cells["source"].str.contains("held = torch.empty", regex=False)]
    expect(len(work) == 1, f"the busy cell is not in the cells table: {list(cells['source'])}")
    row = work.iloc[0]
    expect(
        row["utilization_of"] == "cuda:0",
        f"utilisation of {row['utilization_of']!r}, not of cuda:0, the GPU this process used",
    )
    expect(row["peak_utilization"] > 0, f"peak utilisation {row['peak_utilization']} while a matmul loop ran")
    expect(row["peak_process_memory"] >= GiB, f"peak process memory {row['peak_process_memory']}")
    c.ok("del held, a, b")
    detail = (
        f"{len(first)} samples of {name}; this process {own / GiB:.2f} GiB; busy cell peak "
        f"{row['peak_utilization']:.0f}% utilisation, {row['peak_process_memory'] / GiB:.2f} GiB; "
        f"CPU per sample {w.sample_cpu_mean_s * 1e6:.0f} µs"
    )
    return detail, {"samples": len(first), "process_bytes": own, "peak_utilization": float(row["peak_utilization"])}


_RESNET = """\
import torch
try:
    import torchvision
    model = torchvision.models.resnet18(num_classes=1000)
    model_kind = "torchvision resnet18"
except ImportError:  # a ResNet-like model of our own
    from torch import nn
    def block(cin, cout, stride):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())
    model = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                          block(64, 64, 1), block(64, 128, 2), block(128, 256, 2), block(256, 512, 2),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000))
    model_kind = "ResNet-like (no torchvision)"
model = model.cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x = torch.randn(64, 3, 224, 224, device="cuda")
y = torch.randint(0, 1000, (64,), device="cuda")
torch.nn.functional.cross_entropy(model(x), y).backward()  # warm-up: cuDNN/cuBLAS workspaces
model.zero_grad(set_to_none=True)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # no momentum buffers yet
del x, y
torch.cuda.synchronize()
"""

_STEP = """\
%%memtrace -q
x = torch.randn(64, 3, 224, 224, device="cuda")
y = torch.randint(0, 1000, (64,), device="cuda")
loss = torch.nn.functional.cross_entropy(model(x), y)
loss.backward()
optimizer.step()
optimizer.zero_grad(set_to_none=True)
"""


def _rounded(nbytes: int) -> int:
    return -(-nbytes // 512) * 512  # the caching allocator's 512-byte granularity


@check("memtrace_resnet")
def memtrace_resnet(c: Cells) -> tuple[str, dict[str, Any]]:
    c.ok(_RESNET)
    _, _, html = c.ok(_STEP)
    t = c.ns["_memtrace"]
    expect(t.device.kind == "cuda", f"traced {t.device.kind}, not CUDA")
    rows = t.lines.set_index("line")
    expect(list(rows.index) == [2, 3, 4, 5, 6, 7], f"statement lines {list(rows.index)}")
    params = sum(_rounded(p.numel() * p.element_size()) for p in c.ns["model"].parameters())
    x_bytes = 64 * 3 * 224 * 224 * 4
    d = rows["delta_bytes"]
    expect(d[2] == x_bytes, f"x: delta {d[2]}, the tensor is {x_bytes} bytes")
    expect(d[3] == 512, f"y: delta {d[3]}, 64 int64 round to 512")
    expect(d[4] > 200 * MiB, f"forward: {d[4]} bytes of saved activations")
    expect(rows.loc[4, "peak_bytes"] >= d[4], "forward: peak below its delta")
    expect(d[5] < 0, f"backward: delta {d[5]}, should free the activations")
    expect(abs(d[6] - params) <= 2 * MiB, f"optimizer.step: delta {d[6]}, momentum buffers are {params}")
    expect(abs(d[7] + params) <= 2 * MiB, f"zero_grad(set_to_none): delta {d[7]}, gradients are {params}")
    expect((rows["reserved_bytes"] >= rows["allocated_bytes"]).all(), "reserved below allocated")
    # the tensor census's categories (issue 16), adding up to the allocator's total
    expect(t.has_categories, "no categories: the tensor census did not run on CUDA")
    cats = ["params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
            "temporaries_bytes", "inputs_bytes", "other_bytes"]  # fmt: skip
    expect((rows[cats].sum(axis=1) == rows["allocated_bytes"]).all(), "categories do not add up")
    expect((rows["other_bytes"] >= 0).all(), f"negative other: {list(rows['other_bytes'])}")
    expect(rows.loc[2, "inputs_bytes"] >= x_bytes, "x is not under inputs")
    expect(abs(rows.loc[4, "activations_bytes"] - d[4]) <= 2 * MiB, "forward: its delta is not activations")
    expect(rows.loc[5, "activations_bytes"] == 0, "backward left activations")
    expect(abs(rows.loc[5, "grads_bytes"] - params) <= 2 * MiB, "gradients after backward")
    expect(abs(rows.loc[6, "optimizer_bytes"] - params) <= 2 * MiB, "optimizer state after step")
    expect(rows.loc[7, "grads_bytes"] == 0, "gradients after zero_grad(set_to_none=True)")
    peak = t.at_peak
    expect(peak is not None and peak.activations > 0 and peak.modules, f"at the peak: {peak!r}")
    expect(
        t.time_label == "host time",
        f"time column {t.time_label!r}: on CUDA it is host time, kernels run asynchronously",
    )
    expect("cuda:0" in html, "the HTML report does not name cuda:0")
    detail = (
        f"{c.ns['model_kind']}, batch 64: forward +{d[4] / MiB:.0f} MiB (peak {rows.loc[4, 'peak_bytes'] / MiB:.0f}), "
        f"backward {d[5] / MiB:+.0f} MiB, step +{d[6] / MiB:.1f} MiB = momentum, zero_grad {d[7] / MiB:+.1f} MiB; "
        f"activations after forward {rows.loc[4, 'activations_bytes'] / MiB:.0f} MiB, other at most "
        f"{rows['other_bytes'].max() / MiB:.1f} MiB; {peak!r}"
    )
    c.ok("del model, optimizer, x, y, loss")
    return detail, {k: int(v) for k, v in d.items()}


_SLOW = """\
import time
from itertools import islice

import gpumagic
import torch
from torch.utils.data import DataLoader, Dataset


class SlowData(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        time.sleep(0.0001)  # per-sample CPU work in the training process (num_workers=0)
        return torch.randn(1024), i % 10


loader = DataLoader(SlowData(), batch_size=256, num_workers=0, pin_memory=False)
W1 = torch.randn(1024, 4096, device="cuda")
W2 = torch.randn(4096, 4096, device="cuda") / 64
matmul = torch.backends.cuda.matmul
if hasattr(matmul, "fp32_precision"):
    _precision = matmul.fp32_precision
    matmul.fp32_precision = "ieee"  # fp32 matmuls without TF32: no tensor cores
else:
    _precision = matmul.allow_tf32
    matmul.allow_tf32 = False
"""

_SLOW_LOOP = """\
%%gpuprofile -q -n slow
for x, y in islice(loader, 6):
    x = x.cuda()  # pageable memory: a blocking copy
    y = y.cuda()
    h = x @ W1
    for _ in range(8):
        h = h @ W2
        total = h.abs().mean().item()  # a device sync per micro-step
    gpumagic.step()
"""

_RESTORE = """\
if hasattr(matmul, "fp32_precision"):
    matmul.fp32_precision = _precision
else:
    matmul.allow_tf32 = _precision
"""


@check("gpuprofile_slow_loop")
def gpuprofile_slow_loop(c: Cells) -> tuple[str, dict[str, Any]]:
    import torch

    c.ok(_SLOW)
    try:
        c.ok(_SLOW_LOOP)
    finally:
        c.run(_RESTORE)
    p = c.ns["_gpuprofile"]
    s = p.summary
    rules = {f.rule: f for f in p.findings}
    wanted = ["dataloader", "pageable_memcpy", "sync", "tensor_cores"]
    missing = [r for r in wanted if r not in rules]
    expect(not missing, f"findings {sorted(rules)}; missing {missing}; notes {p.notes}")
    expect(s.cpu_only is False and p.notes == [], f"GPU events missing? notes {p.notes}")
    expect(
        s.steps == 5 and s.first_step_left_out is True,
        f"steps {s.steps} (6 marked, the first left out: cuBLAS/cuDNN setup, lazy loading)",
    )
    name = torch.cuda.get_device_name(torch.cuda.current_device())
    expect(s.devices == [name], f"devices {s.devices}, torch's {name!r}")
    expect(rules["dataloader"].confirmed, "dataloader finding not confirmed by num_workers=0")
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        got = rules["tensor_cores"].evidence.get("matmul_fp32_precision")
        expect(
            got == "ieee",
            f"tensor_cores evidence reads matmul_fp32_precision={got!r} (the torch 2.9+ API)",
        )
    for f in p.findings:
        expect(0 <= f.saving_us <= s.step_time_us * 1.01, f"{f.rule}: saving {f.saving_us} > step")
    detail = (
        f"step {s.step_time_us / 1000:.1f} ms over {s.steps} steps; fired: "
        + ", ".join(f"{r} (saves ~{rules[r].saving_us / 1000:.1f} ms)" for r in wanted)
        + f"; all findings: {', '.join(sorted(rules))}"
    )
    c.ok("del loader, W1, W2")
    return detail, {"findings": sorted(rules), "step_time_us": s.step_time_us, "steps": s.steps}


_OOM = """\
%%memtrace
def step():
    activations = torch.ones(2**30, device="cuda")  # 4 GiB held by this frame
    return torch.empty(too_much, dtype=torch.uint8, device="cuda")
result = step()
"""


@check("memtrace_oom")
def memtrace_oom(c: Cells) -> tuple[str, dict[str, Any]]:
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_allocated()
    total = torch.cuda.get_device_properties(0).total_memory
    # A plain cudaMalloc far beyond the card (never managed memory): it fails at once.
    too_much = max(200 * GiB, int(total * 1.4)) // (2 * MiB) * (2 * MiB)
    c.ns.update(too_much=too_much, torch=torch)
    c.ns.pop("result", None)
    r, _, html = c.run(_OOM)
    err = r.error_in_exec
    expect(isinstance(err, torch.OutOfMemoryError), f"the cell raised {type(err).__name__}: {err}")
    expect("result" not in c.ns, "the failed assignment left a value behind")
    t = c.ns["_memtrace"]
    oom = t.oom
    expect(oom is not None, "no out-of-memory report")
    expect(oom.requested is not None and abs(oom.requested - too_much) < 64 * MiB, f"asked for {oom.requested}, the cell {too_much}")
    expect(oom.total == total, f"total {oom.total}, torch's {total}")
    expect(oom.free is not None and 0 <= oom.free <= total, f"free {oom.free}")
    expect(oom.released is not None and oom.released >= 4 * GiB, f"released {oom.released}: the frame held 4 GiB")
    expect("Out of memory on cuda:0" in html, "no 'Out of memory on cuda:0' in the HTML report")
    expect(oom.memfit.startswith(("%%memfit --gpu ", "%%memfit --memory ")), f"the report's %%memfit line: {oom.memfit!r}")
    gc.collect()
    now = torch.cuda.memory_allocated()
    expect(now == baseline, f"{now - baseline} bytes still allocated after the failed cell")
    c.ok("%%memtrace -q\nok = torch.ones(8, device='cuda').sum().item()\n")
    expect(c.ns["ok"] == 8.0, "the next cell on the GPU did not run")
    detail = (
        f"asked {oom.requested / GiB:.0f} GiB of {total / GiB:.1f} GiB, free {oom.free / GiB:.1f} GiB; "
        f"released {oom.released / GiB:.1f} GiB with the frames; allocated back to baseline "
        f"({baseline} bytes); the next cell ran; offered: {oom.memfit}"
    )
    return detail, {"requested": oom.requested, "free": oom.free, "released": oom.released}


def _given_bytes(model: Any, optimizer: Any) -> int:
    """The bytes the step is given on the GPU: parameters, buffers, gradients, optimizer state."""
    import torch

    tensors = [*model.parameters(), *model.buffers()]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t.is_cuda}
    return sum(_rounded(n) for n in storages.values())


@check("memfit_resnet")
def memfit_resnet(c: Cells) -> tuple[str, dict[str, Any]]:
    import torch

    c.ok(_RESNET)
    step = _STEP.replace("%%memtrace -q\n", "")
    c.ok("%%memfit -q --what-if amp\n" + step)
    fit = c.ns["_memfit"]
    expect(fit.target is not None and "this GPU" in fit.target.name, f"target {fit.target}")
    expect(fit.on_gpu, "the dry run did not use the GPU path")
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    given = _given_bytes(c.ns["model"], c.ns["optimizer"])
    torch.cuda.reset_peak_memory_stats()
    c.ok(step)
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - (before - given)
    ratio = fit.peak_bytes / measured
    expect(abs(fit.peak_bytes - measured) <= 0.10 * measured,
           f"predicted {fit.peak_bytes / MiB:.1f} MiB, max_memory_allocated of the step {measured / MiB:.1f} MiB")  # fmt: skip
    amp = fit.what_if.set_index("fix").loc["amp"]
    detail = (
        f"{c.ns['model_kind']}, batch 64: predicted {fit.peak_bytes / MiB:.0f} MiB at line {fit.peak_line}, "
        f"measured {measured / MiB:.0f} MiB (ratio {ratio:.3f}); verdict on this GPU {fit.fits}; "
        f"amp would save {amp['saving_bytes'] / MiB:.0f} MiB; dry runs {fit.seconds:.1f} s"
    )
    c.ok("del model, optimizer, x, y, loss")
    return detail, {"predicted": fit.peak_bytes, "measured": measured, "ratio": ratio}


# Plausible shares of a datasheet's figure on a healthy, idle card: cuBLAS reaches 60-90% of
# the dense tensor peak at 8192 (less for TF32 and FP32 on the CUDA cores), a device copy
# 80-95% of the memory's bandwidth, a pinned copy 70-90% of the link's (a host whose slot
# runs a generation lower shows half of that, and %gpucheck then says so).
GPUCHECK_RANGES = {
    "fp32": (0.4, 1.1), "tf32": (0.3, 1.1), "bf16": (0.4, 1.1), "fp16": (0.4, 1.1),
    "memory": (0.5, 1.05), "h2d_pinned": (0.3, 1.0), "d2h_pinned": (0.3, 1.0),
}  # fmt: skip


@check("gpucheck")
def gpucheck(c: Cells) -> tuple[str, dict[str, Any]]:
    import torch

    from gpumagic.render.gpucheck import fmt_figure

    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    c.ok("r = %gpucheck -o")
    r = c.ns["r"]
    expect(getattr(matmul, "fp32_precision", None) == precision, "the user's TF32 setting changed")
    name = torch.cuda.get_device_name(0)
    card = next((k for k in r.cards if k.cuda_index == 0), None)
    expect(card is not None, f"cuda:0 not checked; cards {[k.label for k in r.cards]}; {r.unchecked}")
    expect(card.reading.name == name, f"NVML read {card.reading.name!r}, torch's cuda:0 is {name!r}")
    expect(card.specs is not None, f"no specification for {name}: {card.no_specs}")
    reading = card.reading
    for what in ("sm_clock_max", "power_limit", "power_default", "temperature", "persistence"):
        expect(getattr(reading, what) is not None, f"NVML gave no {what}: {reading.unreadable}")
    expect(reading.pcie.gen_max and reading.pcie.width_max, f"no PCIe link: {reading.pcie}")
    expect(card.load is not None and card.load.sm_clock, f"nothing read under load: {card.load}")
    expect("cpu-only-torch" not in r.codes and "cuda-unavailable" not in r.codes, f"findings {r.codes}")
    lines, data = [], {"codes": r.codes, "figures": {}}
    for m in card.measurements:
        data["figures"][m.key] = {"value": m.value, "spec": m.spec, "ratio": m.ratio, "source": m.spec_source}
        if m.key == "launch":
            expect(0 < m.value < 100, f"a kernel launch takes {m.value:.1f} µs of host time")
            lines.append(f"launch {m.value:.1f} µs")
            continue
        low_high = GPUCHECK_RANGES.get(m.key)
        if low_high is None or m.spec is None:
            lines.append(f"{m.key} {fmt_figure(m.value, m.unit)} (no specification)")
            continue
        low, high = low_high
        said = f"{m.key} {fmt_figure(m.value, m.unit)} = {m.ratio:.0%} of {fmt_figure(m.spec, m.unit)} [{m.spec_source}]"
        print(said, flush=True)  # the source of each figure, in the log
        expect(low <= m.ratio <= high, f"{said}: outside {low:.0%}-{high:.0%}; findings {r.codes}")
        lines.append(said)
    expect(len(data["figures"]) >= 10, f"figures measured: {sorted(data['figures'])}")
    load = card.load
    detail = (
        f"{name} ({card.spec_name}, {card.specs.form}); under load SM {load.sm_clock} of "
        f"{reading.sm_clock_max} MHz, {load.power_draw} W of {reading.power_limit} W, reasons "
        f"{load.clock_events}; link Gen {card.link_load.pcie_gen if card.link_load else '?'} "
        f"x{reading.pcie.width}; findings {r.codes or 'none'}; " + "; ".join(lines)
    )
    c.ok("del r")
    return detail, data


def _alarm(signum: int, frame: Any) -> None:
    raise CheckTimeout("time limit")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="JSON lines, one per check")
    parser.add_argument("--budget", type=float, default=85.0, help="seconds for every check together")
    parser.add_argument("--only", default="", help="comma-separated checks")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.budget
    out = open(args.json, "a", encoding="utf-8")  # noqa: SIM115 - one line per check, as they end

    def emit(name: str, status: str, seconds: float, detail: str, data: dict[str, Any] | None = None) -> None:
        out.write(json.dumps({"name": name, "status": status, "seconds": round(seconds, 2),
                              "detail": detail, "data": data or {}}, default=str) + "\n")  # fmt: skip
        out.flush()
        print(f"{name}: {status}: {detail}", flush=True)

    os.environ.setdefault("GPUMAGIC_LIVE", "off")
    t0 = time.monotonic()
    import IPython
    import torch

    import gpumagic

    cuda = torch.cuda.is_available()
    cells = Cells()
    emit("shell", "passed", time.monotonic() - t0,
         f"IPython {IPython.__version__} InteractiveShell, gpumagic {gpumagic.__version__} loaded from "
         f"{Path(gpumagic.__file__).parent}; torch {torch.__version__}")  # fmt: skip
    only = {n for n in args.only.split(",") if n}
    signal.signal(signal.SIGALRM, _alarm)
    for name, fn in CHECKS:
        if only and name not in only:
            continue
        if not cuda:
            emit(name, "not on a GPU", 0.0, "torch.cuda.is_available() is False: not run")
            continue
        left = deadline - time.monotonic()
        if left < 3:
            emit(name, "timeout", 0.0, "not started: the cells' time budget was spent")
            continue
        start = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, min(PER_CHECK_S, left))
        try:
            detail, data = fn(cells)
            status = "passed"
        except CheckTimeout:
            status, detail, data = "timeout", f"ran past {min(PER_CHECK_S, left):.0f} s", {}
        except Failed as exc:
            status, detail, data = "failed", str(exc), {}
        except Exception as exc:
            status, detail = "failed", f"{type(exc).__name__}: {exc}"
            data = {"traceback": traceback.format_exc()[-3000:]}
            print(data["traceback"], flush=True)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        emit(name, status, time.monotonic() - start, detail, data)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
