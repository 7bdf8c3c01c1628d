"""Text and HTML for ``%gpuenv`` / ``gpumagic.env()``: the traps first, then the facts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumagic.render.html import escape, kv, table, text_table, wrap
from gpumagic.units import fmt_bytes

if TYPE_CHECKING:
    from gpumagic.environment.checks import Finding
    from gpumagic.environment.report import EnvReport, GpuInfo

_LEVEL_MARK = {"error": "✖", "warning": "!", "info": "i"}


def _value(value: object) -> str:
    if value is None:
        return "–"
    return str(value)


def _env_value(value: str | None) -> str:
    # Unset and set-but-empty mean opposite things for CUDA_VISIBLE_DEVICES: keep them apart.
    if value is None:
        return "unset"
    if value == "":
        return '"" (set, empty)'
    return value


def _gpu_rows(gpus: list[GpuInfo]) -> list[list[str]]:
    return [
        [
            str(g.index),
            g.name,
            fmt_bytes(g.total_memory),
            fmt_bytes(g.used_memory),
            _value(g.capability),
            _value(g.multiprocessors),
        ]
        for g in gpus
    ]


_GPU_HEADERS = ["#", "name", "memory", "used", "capability", "SMs"]


def _gpu_title(r: EnvReport) -> str:
    if r.cuda_available:
        return "GPUs (torch device index; used memory from NVML)"
    return "GPUs the NVIDIA driver sees (NVML index; not usable by this torch)"


def _build_items(r: EnvReport) -> list[tuple[str, str]]:
    return [
        ("torch", f"{_value(r.torch_version)} ({r.torch_build})"),
        ("CUDA runtime", _value(r.cuda_runtime)),
        ("cuDNN", _value(r.cudnn)),
        ("NCCL", _value(r.nccl)),
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
        ("os.cpu_count()", _value(c.logical)),
        ("affinity", _value(c.affinity)),
        ("cgroup quota", quota),
        ("torch threads", _value(r.torch_threads)),
        ("interop threads", _value(r.torch_interop_threads)),
        ("DataLoader num_workers", str(r.num_workers)),
    ]


def _finding_text(f: Finding) -> str:
    return f"{_LEVEL_MARK.get(f.level, '-')} {f.level}: {f.message}\n    fix: {f.fix}"


def env_text(r: EnvReport) -> str:
    parts = [f"%gpuenv: {r.gpu_summary}"]
    if r.findings:
        parts.append("\n".join(_finding_text(f) for f in r.findings))
    if r.gpus:
        parts.append(_gpu_title(r) + "\n" + text_table(_GPU_HEADERS, _gpu_rows(r.gpus), left=[1]))
    parts.append("\n".join(f"{k}: {v}" for k, v in _build_items(r)))
    parts.append(
        "CPUs: " + ", ".join(f"{k} {v}" for k, v in _cpu_items(r)) + f"\n  ({r.num_workers_rule})"
    )
    parts.append(
        "flags\n"
        + text_table(
            ["setting", "value"], [[k, _value(v)] for k, v in r.flags.items()], left=[0, 1]
        )
    )
    parts.append(
        "environment variables\n"
        + text_table(
            ["variable", "value"], [[k, _env_value(v)] for k, v in r.env_vars.items()], left=[0, 1]
        )
    )
    parts.append(
        "packages\n"
        + text_table(["package", "version"], [[k, v] for k, v in r.packages.items()], left=[0, 1])
    )
    return "\n\n".join(parts)


def _finding_html(f: Finding) -> str:
    cls = "gm-box gm-info" if f.level == "info" else "gm-box"
    return (
        f'<div class="{cls}" data-level="{escape(f.level)}" data-code="{escape(f.code)}">'
        f"<b>{escape(f.level)}</b>: {escape(f.message)}"
        f'<div class="gm-note">fix: {escape(f.fix)}</div></div>'
    )


def _esc_rows(rows: list[list[str]]) -> list[list[str]]:
    return [[escape(c) for c in row] for row in rows]


def env_html(r: EnvReport) -> str:
    body = [f'<h4>%gpuenv <span class="gm-sub">{escape(r.gpu_summary)}</span></h4>']
    body.extend(_finding_html(f) for f in r.findings)
    if r.gpus:
        body.append(f'<div class="gm-note">{escape(_gpu_title(r))}</div>')
        body.append(table(_GPU_HEADERS, _esc_rows(_gpu_rows(r.gpus)), left=[1]))
    body.append(kv((k, escape(v)) for k, v in _build_items(r)))
    body.append(kv((k, escape(v)) for k, v in _cpu_items(r)))
    body.append(f'<div class="gm-note">num_workers rule: {escape(r.num_workers_rule)}</div>')
    flags = [[k, _value(v)] for k, v in r.flags.items()]
    env_rows = [[k, _env_value(v)] for k, v in r.env_vars.items()]
    packages = [[k, v] for k, v in r.packages.items()]
    body.append(
        "<details open><summary>flags and environment variables</summary>"
        + table(["setting", "value"], _esc_rows(flags), code=[0], left=[1])
        + table(["variable", "value"], _esc_rows(env_rows), code=[0], left=[1])
        + "</details>"
    )
    body.append(
        "<details><summary>packages</summary>"
        + table(["package", "version"], _esc_rows(packages), left=[0, 1])
        + "</details>"
    )
    return wrap("env", "".join(body))
