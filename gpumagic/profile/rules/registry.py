"""Every rule, in the order they run, and :func:`diagnose`, which runs them and ranks
what they find."""

from __future__ import annotations

from typing import Any

from gpumagic.profile.analysis.trace_analysis import Analysis
from gpumagic.profile.analysis.where import locate
from gpumagic.profile.rules import (
    communication,
    input_pipeline,
    kernels_memory,
    optimizer,
    precision,
    sync_launch,
)
from gpumagic.profile.rules.base import SEVERITIES, Context, Finding, Rule, severity
from gpumagic.profile.trace.session import LiveState

RULES: dict[str, Rule[Any]] = {
    rule.name: rule
    for rule in (
        Rule(
            "dataloader",
            input_pipeline.detect_dataloader,
            input_pipeline.advise_dataloader,
            category="DataLoader",
        ),
        Rule(
            "pageable_memcpy",
            input_pipeline.detect_pageable_memcpy,
            input_pipeline.advise_pageable_memcpy,
            category="Memcpy",
        ),
        Rule("sync", sync_launch.detect_sync, sync_launch.advise_sync),
        Rule("launch_bound", sync_launch.detect_launch_bound, sync_launch.advise_launch_bound),
        Rule("tensor_cores", precision.detect_tensor_cores, precision.advise_tensor_cores),
        Rule(
            "low_utilization",
            kernels_memory.detect_low_utilization,
            kernels_memory.advise_low_utilization,
        ),
        Rule("small_grid", kernels_memory.detect_small_grid, kernels_memory.advise_small_grid),
        Rule(
            "memory_ceiling",
            kernels_memory.detect_memory_ceiling,
            kernels_memory.advise_memory_ceiling,
        ),
        Rule("optimizer", optimizer.detect_optimizer, optimizer.advise_optimizer),
        Rule("zero_grad", optimizer.detect_zero_grad, optimizer.advise_zero_grad),
        Rule(
            "cudnn_benchmark",
            kernels_memory.detect_cudnn_benchmark,
            kernels_memory.advise_cudnn_benchmark,
        ),
        Rule(
            "communication",
            communication.detect_communication,
            communication.advise_communication,
            category="Communication",
        ),
        Rule("dataparallel", communication.detect_dataparallel, communication.advise_dataparallel),
        Rule("gloo_on_gpu", communication.detect_gloo_on_gpu, communication.advise_gloo_on_gpu),
    )
}


def point_at_code(findings: list[Finding], analysis: Analysis) -> None:
    """Give each finding the line (and module) its evidence comes from, where the trace
    has the cell's statement ranges (see :mod:`gpumagic.profile.analysis.where`)."""
    if not len(analysis.trace.code.statements) and not len(analysis.trace.code.modules):
        return
    for f in findings:
        if f.rows is None:
            continue
        place = locate(analysis, f.rows)
        f.line, f.source, f.module = place.line, place.source, place.module


def diagnose(analysis: Analysis, live: LiveState | None = None) -> list[Finding]:
    """Run every rule; findings ranked by estimated saving (then severity)."""
    if len(analysis.steps) == 0:
        return []
    ctx = Context(analysis, live)
    found = [f for rule in RULES.values() if (f := rule(ctx)) is not None]
    low = next((f for f in found if f.rule == "low_utilization"), None)
    if low is not None:
        explained = sum(f.saving_us for f in found if f is not low)
        low.saving_us = max(low.saving_us - explained, 0.0)
        low.evidence["unexplained_idle_us_per_step"] = round(low.saving_us, 1)
        low.severity = severity(low.saving_us, ctx.step_us)
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    found.sort(key=lambda f: (-f.saving_us, rank.get(f.severity, 3), f.rule))
    point_at_code(found, analysis)
    return found
