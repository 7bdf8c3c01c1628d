"""Two machines side by side (issue 29): what differs between two environments, what is known
to change speed first, each with a line on why it matters, and what cannot matter last.

Each environment (a saved file, or this machine now: :mod:`gpumagic.environment.saved`) is
flattened into facts, ``setting -> value``, each with its tier and why. Tiers, in order:

- ``speed``: settings known to change speed, ranked card, clocks and limits, link, driver
  and libraries, the TF32/cuDNN flags and matmul precision, CPU threads, visible devices and
  the environment variables that change what torch does;
- ``measured``: figures a ``%gpucheck`` measured on both sides, listed only when they differ
  by more than :data:`MEASURED_TOLERANCE` (every run differs a little; on a shared machine
  noise alone can pass it, so a setting above is the lead and a figure its evidence);
- ``maybe``: can matter for some work (Python, the platform, numpy, allocator settings);
- ``none``: cannot change speed (where Python lives, a plotting package's version).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpumagic.environment.saved import SavedEnv, load
from gpumagic.render.html import Rendered
from gpumagic.units import fmt_bytes, fmt_flops, fmt_gbps, fmt_us

if TYPE_CHECKING:
    import pandas as pd

    from gpumagic.render.sections import Report

TIERS = ("speed", "measured", "maybe", "none")
MEASURED_TOLERANCE = 0.15

# Ranks inside the speed tier: the card first, environment variables last.
CARD, CLOCKS, LINK, LIBRARIES, FLAGS, PRECISION, THREADS, VISIBLE, VARIABLES, MEASURED = range(10)

WHY_FLAG = {
    "torch.backends.cudnn.enabled": (FLAGS, "off, convolutions run torch's own kernels, much slower than cuDNN's"),
    "torch.backends.cudnn.benchmark": (FLAGS, "on, cuDNN times its algorithms per input shape and keeps the fastest; off, it takes its heuristic's pick"),
    "torch.backends.cudnn.deterministic": (FLAGS, "on, cuDNN may use only its deterministic algorithms, often slower ones"),
    "torch.are_deterministic_algorithms_enabled()": (FLAGS, "deterministic algorithms are slower where torch has them"),
    "torch.backends.cuda.matmul.allow_tf32": (PRECISION, "TF32 runs float32 matmuls on the tensor cores, several times faster on Ampere and newer"),
    "torch.backends.cudnn.allow_tf32": (PRECISION, "TF32 runs float32 convolutions on the tensor cores"),
    "torch.get_float32_matmul_precision()": (PRECISION, "'high' and 'medium' let float32 matmuls use TF32 or bf16 tensor cores; 'highest' does not"),
    "torch.backends.cuda.matmul.fp32_precision": (PRECISION, "'tf32' runs float32 matmuls on the tensor cores; 'ieee' does not"),
    "torch.backends.cudnn.fp32_precision": (PRECISION, "'tf32' runs float32 convolutions on the tensor cores"),
}  # fmt: skip
WHY_VARIABLE = {
    "CUDA_VISIBLE_DEVICES": ("speed", VISIBLE, "which cards this process gets, and how many"),
    "CUDA_DEVICE_ORDER": ("speed", VISIBLE, "which card is cuda:0"),
    "CUDA_LAUNCH_BLOCKING": ("speed", VARIABLES, "set, every kernel launch waits for the GPU"),
    "OMP_NUM_THREADS": ("speed", VARIABLES, "how many threads CPU ops use"),
    "MKL_NUM_THREADS": ("speed", VARIABLES, "how many threads MKL's CPU ops use"),
    "PYTORCH_CUDA_ALLOC_CONF": ("maybe", VARIABLES, "allocator settings change fragmentation and how often memory is returned"),
    "PYTORCH_ALLOC_CONF": ("maybe", VARIABLES, "allocator settings change fragmentation and how often memory is returned"),
    "CUBLAS_WORKSPACE_CONFIG": ("maybe", VARIABLES, "a smaller cuBLAS workspace can slow some matmuls"),
}  # fmt: skip
WHY_PACKAGE = {
    "triton": ("speed", LIBRARIES, "torch.compile's GPU kernels are Triton's"),
    "torchvision": ("maybe", LIBRARIES, "its image decoding and transforms run in the input pipeline"),
    "torchaudio": ("maybe", LIBRARIES, "its decoding and transforms run in the input pipeline"),
    "numpy": ("maybe", LIBRARIES, "CPU-side preprocessing often runs in numpy"),
}  # fmt: skip
NOT_SPEED = "not on the path of the work"


@dataclass(frozen=True)
class Fact:
    value: str
    tier: str
    rank: int
    why: str
    measured: float | None = None  # a measured figure's number, compared with tolerance


@dataclass(frozen=True)
class Difference:
    """One setting that differs: its value on each side, its tier and why it matters."""

    setting: str
    a: str
    b: str
    tier: str
    why: str


@dataclass(repr=False)
class EnvDiff(Rendered):
    """What differs between ``a`` and ``b`` (their labels: file names or "this machine"),
    ranked (module docstring); ``same``: how many compared settings and figures are equal."""

    a: str
    b: str
    differences: list[Difference]
    same: int
    a_saved_at: float | None = None
    b_saved_at: float | None = None
    notes: tuple[str, ...] = ()
    tolerance: float = MEASURED_TOLERANCE  # measured figures closer than this count as equal

    def tier(self, name: str) -> list[Difference]:
        return [d for d in self.differences if d.tier == name]

    @property
    def settings(self) -> list[str]:
        """The settings that differ, in rank order."""
        return [d.setting for d in self.differences]

    @property
    def frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(
            [(d.setting, d.a, d.b, d.tier, d.why) for d in self.differences],
            columns=["setting", self.a, self.b, "tier", "why"],
        )

    def _report(self) -> Report:
        from gpumagic.render.env_diff import env_diff_report

        return env_diff_report(self)


def env_diff(a: str | os.PathLike[str] | SavedEnv, b: str | os.PathLike[str] | SavedEnv) -> EnvDiff:
    """Compare two saved environments (``%gpuenv --save`` files, or :class:`SavedEnv`);
    :class:`~gpumagic.environment.saved.SavedEnvError` for a file that is not one."""
    left = a if isinstance(a, SavedEnv) else load(a)
    right = b if isinstance(b, SavedEnv) else load(b)
    return diff(left, right)


def diff(a: SavedEnv, b: SavedEnv) -> EnvDiff:
    fa, fb = facts(a), facts(b)
    same = 0
    order: list[tuple[int, int, int, Difference]] = []
    for i, key in enumerate(dict.fromkeys([*fa, *fb])):
        x, y = fa.get(key), fb.get(key)
        if x is not None and y is not None and _equal(x, y):
            same += 1
            continue
        ref = x or y
        assert ref is not None
        d = Difference(key, x.value if x else "–", y.value if y else "–", ref.tier, ref.why)
        order.append((TIERS.index(ref.tier), ref.rank, i, d))
    differences = [d for *_, d in sorted(order, key=lambda t: t[:3])]
    notes = []
    if (a.check is None) != (b.check is None):
        which = a.label if a.check is None else b.label
        notes.append(f"{which} has no %gpucheck: its cards' limits, link and figures are not compared")
    label_b = b.label if b.label != a.label else f"{b.label} (2)"
    return EnvDiff(a.label, label_b, differences, same, a.saved_at, b.saved_at, tuple(notes))


def _equal(x: Fact, y: Fact) -> bool:
    if x.measured is not None and y.measured is not None:
        top = max(abs(x.measured), abs(y.measured))
        return top == 0 or abs(x.measured - y.measured) / top <= MEASURED_TOLERANCE
    return x.value == y.value


def facts(saved: SavedEnv) -> dict[str, Fact]:
    """One environment flattened: setting -> its value, tier and why (module docstring)."""
    return dict(_env_facts(saved.env)) | dict(_check_facts(saved.check))


def _text(value: Any) -> str:
    if value is None:
        return "unset"
    if value == "":
        return '"" (set, empty)'
    return str(value)


def _env_facts(env: dict[str, Any]) -> Iterator[tuple[str, Fact]]:
    gpus = env.get("gpus") or []
    yield "GPUs", Fact(str(len(gpus)), "speed", CARD, "a different number of cards")
    for g in gpus:
        memory = f" ({fmt_bytes(g.get('total_memory'))})" if g.get("total_memory") else ""
        yield f"GPU {g.get('index')}", Fact(
            f"{g.get('name')}{memory}", "speed", CARD, "a different card: its throughput, memory and bandwidth differ"
        )  # fmt: skip
    driver = env.get("driver") or {}
    libraries = [
        ("torch", env.get("torch_version"), "operators, kernels and defaults change between torch releases"),
        ("torch build", env.get("torch_build"), "a CPU-only build never uses the GPU; ROCm runs other kernels"),
        ("CUDA available", env.get("cuda_available"), "without CUDA nothing runs on a GPU"),
        ("NVIDIA driver", driver.get("version"), "the driver compiles PTX and schedules the work; fixes and regressions come with it"),
        ("CUDA runtime", env.get("cuda_runtime"), "torch's CUDA libraries (cuBLAS, cuDNN's kernels and heuristics) differ between CUDA versions"),
        ("cuDNN", env.get("cudnn"), "convolution kernels and their choice differ between cuDNN versions"),
        ("NCCL", env.get("nccl"), "collective algorithms differ between NCCL versions (several GPUs)"),
        ("ROCm runtime", env.get("hip_runtime"), "another GPU stack, other kernels"),
    ]  # fmt: skip
    for name, value, why in libraries:
        yield name, Fact(_text(value), "speed", LIBRARIES, why)
    yield "driver's CUDA", Fact(_text(driver.get("cuda")), "maybe", LIBRARIES, "the newest CUDA the driver runs")
    for flag, value in (env.get("flags") or {}).items():
        rank, why = WHY_FLAG.get(flag, (FLAGS, "a torch backend setting"))
        tier = "maybe" if flag not in WHY_FLAG else "speed"
        yield flag, Fact(_text(value), tier, rank, why)
    cpu = env.get("cpu") or {}
    yield "usable CPUs", Fact(_text(cpu.get("usable")), "speed", THREADS, "the CPUs this process may use: data loading and CPU ops run on them")
    yield "CPU affinity", Fact(_text(cpu.get("affinity")), "speed", THREADS, "the cores this process may run on")
    yield "cgroup CPU quota", Fact(_text(cpu.get("quota")), "speed", THREADS, "a container's CPU limit, which the affinity mask does not show")
    yield "torch threads", Fact(_text(env.get("torch_threads")), "speed", THREADS, "the threads torch's CPU ops use")
    yield "interop threads", Fact(_text(env.get("torch_interop_threads")), "maybe", THREADS, "threads for running independent ops side by side")
    yield "os.cpu_count()", Fact(_text(cpu.get("logical")), "maybe", THREADS, "the cores the machine has (this process may have fewer)")
    for name, value in (env.get("env_vars") or {}).items():
        tier, rank, why = WHY_VARIABLE.get(name, ("maybe", VARIABLES, "an environment variable torch reads"))
        yield name, Fact(_text(value), tier, rank, why)
    yield "Python", Fact(_text(env.get("python")), "maybe", LIBRARIES, "the interpreter's own speed (the Python side of each step) differs between versions")
    yield "platform", Fact(_text(env.get("platform")), "maybe", LIBRARIES, "the kernel and C library: scheduling, memory and I/O")
    yield "Python executable", Fact(_text(env.get("python_executable")), "none", 0, "where Python is installed")
    for name, version in (env.get("packages") or {}).items():
        if name == "torch":
            continue  # the torch row above
        tier, rank, why = WHY_PACKAGE.get(name, ("none", 0, NOT_SPEED))
        yield f"package {name}", Fact(_text(version), tier, rank, why)


def _figure(value: float, unit: str) -> str:
    if unit == "FLOP/s":
        return fmt_flops(value)
    if unit == "B/s":
        return fmt_gbps(value / 1e9)
    return fmt_us(value)


def _check_facts(check: dict[str, Any] | None) -> Iterator[tuple[str, Fact]]:
    if not check:
        return
    for i, card in enumerate(check.get("cards") or []):
        r = card.get("reading") or {}
        at = f"checked GPU {card.get('cuda_index', i)}"
        events = (r.get("clock_events") or {}).get("names") or []
        slowing = [e for e in events if e not in ("gpu_idle", "sync_boost", "display_clock_setting")]
        pcie = r.get("pcie") or {}
        mig = r.get("mig")
        ecc = (r.get("ecc") or {}).get("enabled")
        rows = [
            ("power limit", f"{_text(r.get('power_limit'))} W", CLOCKS, "a lower power limit holds the clocks down under load"),
            ("maximum SM clock", f"{_text(r.get('sm_clock_max'))} MHz", CLOCKS, "the highest clock the card may run"),
            ("clock slowdowns", ", ".join(slowing) or "none", CLOCKS, "active slowdowns (heat, power, set clocks) hold the clocks down"),
            ("PCIe slot", f"Gen {_text(pcie.get('gen_max'))} x{_text(pcie.get('width_max'))}", LINK, "every host-device copy runs at the link's speed"),
            ("MIG", "off" if not mig or not mig.get("enabled") else "on", CARD, "a MIG slice has a fraction of the card"),
            ("ECC", _text(ecc), CLOCKS, "ECC on keeps some memory and a little bandwidth for itself"),
            ("compute mode", _text(r.get("compute_mode")), CLOCKS, "Prohibited or Exclusive_Process modes refuse other processes"),
        ]  # fmt: skip
        for name, value, rank, why in rows:
            yield f"{at}: {name}", Fact(value, "speed", rank, why)
        yield f"{at}: persistence mode", Fact(_text(r.get("persistence")), "maybe", CLOCKS, "off, each process that starts CUDA waits for the driver to set the card up")
        for m in card.get("measurements") or []:
            yield f"{at}: {m.get('name')}", _measured(m)
    for m in (check.get("host") or {}).get("measurements") or []:
        yield f"host: {m.get('name')}", _measured(m)


def _measured(m: dict[str, Any]) -> Fact:
    value = float(m.get("value") or 0.0)
    return Fact(
        _figure(value, str(m.get("unit"))), "measured", MEASURED,
        f"measured by %gpucheck on each side; a difference over {MEASURED_TOLERANCE:.0%}",
        value,
    )  # fmt: skip
