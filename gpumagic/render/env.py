"""Text and HTML for ``%gpuenv`` / ``gpumagic.env()``: the traps first, then the facts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpumagic.render.html import Note, escape
from gpumagic.render.sections import (
    Box,
    Details,
    Heading,
    KeyValues,
    Paragraph,
    Report,
    Section,
)
from gpumagic.render.table import Column, Table
from gpumagic.units import fmt_bytes, fmt_text

if TYPE_CHECKING:
    from gpumagic.environment.checks import Finding
    from gpumagic.environment.report import EnvReport, GpuInfo

# a finding's level as one mark, in %gpuenv's traps and %gpucheck's findings
LEVEL_MARK = {"error": "✖", "warning": "!", "info": "i"}


def _env_value(value: str | None) -> str:
    # Unset and set-but-empty mean opposite things for CUDA_VISIBLE_DEVICES: keep them apart.
    if value is None:
        return "unset"
    if value == "":
        return '"" (set, empty)'
    return value


def _gpu_table(gpus: list[GpuInfo]) -> Table:
    return Table(
        [
            Column("#", "index"),
            Column("name", "name", align="left"),
            Column("memory", "total_memory", fmt_bytes),
            Column("used", "used_memory", fmt_bytes),
            Column("capability", "capability"),
            Column("SMs", "multiprocessors"),
        ],
        gpus,
    )


def _pairs(header: str, value: str, rows: dict[str, Any], fmt: Any = fmt_text) -> Table:
    return Table(
        [Column(header, lambda kv: kv[0], align="code"), Column(value, lambda kv: kv[1], fmt, "left")],
        list(rows.items()),
    )


def _gpu_title(r: EnvReport) -> str:
    if r.cuda_available:
        return "GPUs (torch device index; used memory from NVML)"
    return "GPUs the NVIDIA driver sees (NVML index; not usable by this torch)"


def _build_items(r: EnvReport) -> list[tuple[str, str]]:
    return [
        ("torch", f"{fmt_text(r.torch_version)} ({r.torch_build})"),
        ("CUDA runtime", fmt_text(r.cuda_runtime)),
        ("cuDNN", fmt_text(r.cudnn)),
        ("NCCL", fmt_text(r.nccl)),
        ("driver", _driver_text(r)),
        ("Python", f"{r.python} ({r.python_executable})"),
        ("platform", r.platform),
    ]


def _driver_text(r: EnvReport) -> str:
    d = r.driver
    if not d.present:
        return "none found (" + "; ".join(d.checked) + ")"
    text = d.version or "present, version unknown"
    if d.cuda:
        text += f" (supports CUDA ≤ {d.cuda})"
    return f"{text} via {d.source}"


def _cpu_items(r: EnvReport) -> list[tuple[str, str]]:
    c = r.cpu
    quota = f"{c.quota:g}" if c.quota is not None else "none"
    return [
        ("usable CPUs", str(c.usable)),
        ("os.cpu_count()", fmt_text(c.logical)),
        ("affinity", fmt_text(c.affinity)),
        ("cgroup quota", quota),
        ("torch threads", fmt_text(r.torch_threads)),
        ("interop threads", fmt_text(r.torch_interop_threads)),
        ("DataLoader num_workers", str(r.num_workers)),
    ]


def _finding(f: Finding) -> Box:
    return Box(
        [
            Paragraph(f"{LEVEL_MARK.get(f.level, '-')} {f.level}: {f.message}", "plain"),
            Paragraph(f"fix: {f.fix}"),
        ],
        "info" if f.level == "info" else "box",
        attrs=f' data-level="{escape(f.level)}" data-code="{escape(f.code)}"',
    )


def env_report(r: EnvReport) -> Report:
    """The traps first (each with its fix), then the GPUs, the build, the CPUs, the flags and
    environment variables, and the packages."""
    sections: list[Section] = [_finding(f) for f in r.findings]
    if r.gpus:
        sections += [Heading(_gpu_title(r)), _gpu_table(r.gpus)]
    sections += [
        Heading("build"),
        KeyValues(_build_items(r)),
        KeyValues(_cpu_items(r), inline="CPUs"),
        Paragraph(f"num_workers rule: {r.num_workers_rule}", prefix="  "),
        Details(
            "flags and environment variables",
            [
                _pairs("setting", "value", r.flags),
                _pairs("variable", "value", r.env_vars, _env_value),
            ],
            open=True,
        ),
        Details("packages", [_pairs("package", "version", r.packages)]),
    ]
    return Report("env", "%gpuenv", r.gpu_summary, sections)


def saved_note(path: object, check: Any) -> Note:
    """What ``%gpuenv --save`` wrote: the report, and the session's last ``%gpucheck`` (with
    when it ran and what it found) or why there is none."""
    from gpumagic.units import fmt_clock

    what = "the environment report"
    if check is not None:
        found = len(check.findings)
        what += f" and the %gpucheck of {fmt_clock(check.when)} ({found} finding{'s' if found != 1 else ''})"
    else:
        what += " (no %gpucheck ran in this session: --check runs one)"
    return Note(f"Wrote {path}: {what}.", "env-save")
