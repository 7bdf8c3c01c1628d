"""Check the wheels carried to the GPU machine: one version each, the right tags, a closed set.

The GPU machine (python3 3.12, x86-64, no network) gets a folder of wheels that pip installs
there with ``--no-index --no-deps`` (see ``tools/gpu_check.py``). ``--no-deps`` installs
whatever it is given, so a wheel whose requirement is missing only fails later, at import,
on a machine whose time is scarce. This script proves, here, that the set is closed:

- every file is a wheel whose tags that machine accepts (CPython 3.12, manylinux x86-64,
  pure Python), one version per project, exactly the versions ``tools/gpu_wheels.txt`` pins;
- every ``Requires-Dist`` of every wheel (markers evaluated for CPython 3.12 on Linux
  x86-64, no extras) is met by a wheel of the set or by a package the machine has
  (``tools/gpu_machine_packages.txt``; versions checked where known);
- the folder is small enough to travel (the working tree and carried folders: 64 MiB).

    python tools/check_wheels.py .gpu-wheels

On the GPU machine, after the install, ``--installed SITE`` checks the installed set again
against the versions really there (``importlib.metadata``): a missing requirement fails, a
version that differs from what a wheel asks for is reported.
"""

from __future__ import annotations

import argparse
import email.parser
import importlib.metadata
import re
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # a bare interpreter: pip vendors the same library
    from pip._vendor.packaging.markers import default_environment  # type: ignore[assignment,no-redef,unused-ignore]
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment,no-redef,unused-ignore]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[assignment,no-redef,unused-ignore]
    from pip._vendor.packaging.version import Version  # type: ignore[assignment,no-redef,unused-ignore]

TOOLS = Path(__file__).resolve().parent
PINS = TOOLS / "gpu_wheels.txt"
MACHINE = TOOLS / "gpu_machine_packages.txt"
MAX_MIB = 48.0  # of the 64 MiB that travel; the working tree needs the rest
PYTHON = (3, 12)
MAX_GLIBC = (2, 28)  # what `make gpu-wheels` asks pip for; the machine's glibc is newer

_WHEEL = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-(?P<build>\d[^-]*))?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)


@dataclass
class Wheel:
    path: Path
    name: str  # canonical
    version: str
    py: list[str]
    abi: list[str]
    plat: list[str]
    requires: list[str] = field(default_factory=list)


def marker_environment(python: tuple[int, int] = PYTHON) -> dict[str, str]:
    """The marker variables of CPython ``python`` on Linux x86-64."""
    v = f"{python[0]}.{python[1]}"
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{v}.0",
        "os_name": "posix",
        "platform_machine": "x86_64",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": f"{v}.0",
        "platform_python_implementation": "CPython",
        "python_version": v,
        "sys_platform": "linux",
        "extra": "",
    }


def applies(req: Requirement, env: dict[str, str]) -> bool:
    """True when ``req`` is needed without extras in ``env``."""
    if req.marker is None:
        return True
    return bool(req.marker.evaluate(env))


def read_wheel(path: Path) -> Wheel:
    m = _WHEEL.match(path.name)
    if m is None:
        raise ValueError(f"{path.name}: not a wheel file name")
    with zipfile.ZipFile(path) as z:
        meta = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(meta) != 1:
            raise ValueError(f"{path.name}: {len(meta)} METADATA files")
        msg = email.parser.Parser().parsestr(z.read(meta[0]).decode("utf-8"))
    name = canonicalize_name(msg["Name"])
    if name != canonicalize_name(m["name"]):
        raise ValueError(f"{path.name}: METADATA names {msg['Name']!r}")
    if Version(msg["Version"]) != Version(m["version"]):
        raise ValueError(f"{path.name}: METADATA says version {msg['Version']}")
    return Wheel(
        path=path,
        name=name,
        version=msg["Version"],
        py=m["py"].split("."),
        abi=m["abi"].split("."),
        plat=m["plat"].split("."),
        requires=msg.get_all("Requires-Dist") or [],
    )


def _manylinux_glibc(tag: str) -> tuple[int, int] | None:
    legacy = {"manylinux1_x86_64": (2, 5), "manylinux2010_x86_64": (2, 12), "manylinux2014_x86_64": (2, 17)}
    if tag in legacy:
        return legacy[tag]
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", tag)
    return (int(m[1]), int(m[2])) if m else None


def tags_problem(w: Wheel, python: tuple[int, int] = PYTHON, max_glibc: tuple[int, int] = MAX_GLIBC) -> str | None:
    """Why the machine would refuse ``w`` (None when some tag triple of it fits)."""
    cp = f"cp{python[0]}{python[1]}"

    def py_ok(py: str, abi: str) -> bool:
        if py in (f"py{python[0]}", f"py{python[0]}{python[1]}", cp) and abi in ("none", cp):
            return True
        m = re.fullmatch(r"cp(\d)(\d+)", py)  # abi3 wheels run on every later CPython
        return abi == "abi3" and m is not None and (int(m[1]), int(m[2])) <= python

    def plat_ok(plat: str) -> bool:
        if plat == "any":
            return True
        glibc = _manylinux_glibc(plat)
        return glibc is not None and glibc <= max_glibc

    if any(py_ok(p, a) for p in w.py for a in w.abi) and any(plat_ok(p) for p in w.plat):
        return None
    return f"tags {'.'.join(w.py)}-{'.'.join(w.abi)}-{'.'.join(w.plat)} do not fit CPython {python[0]}.{python[1]} on manylinux x86-64 (glibc <= {max_glibc[0]}.{max_glibc[1]})"


def read_list(path: Path) -> dict[str, str | None]:
    """``name[==version]`` lines (comments and blanks skipped) -> {canonical name: version}."""
    out: dict[str, str | None] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        out[canonicalize_name(name.strip())] = version.strip() or None
    return out


@dataclass
class Report:
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    wheels: int = 0
    total_bytes: int = 0
    by_set: int = 0
    by_machine: int = 0
    unchecked: set[str] = field(default_factory=set)


def check_folder(
    folder: Path,
    pins: dict[str, str | None] | None,
    machine: dict[str, str | None],
    max_mib: float = MAX_MIB,
    python: tuple[int, int] = PYTHON,
) -> Report:
    rep = Report()
    if not folder.is_dir():
        rep.errors.append(f"{folder}: no such folder (run `make gpu-wheels`)")
        return rep
    wheels: dict[str, Wheel] = {}
    for path in sorted(folder.iterdir()):
        rep.total_bytes += path.stat().st_size if path.is_file() else 0
        if not path.name.endswith(".whl"):
            rep.errors.append(f"{path.name}: not a wheel (the machine installs wheels only)")
            continue
        try:
            w = read_wheel(path)
        except (ValueError, zipfile.BadZipFile, KeyError) as exc:
            rep.errors.append(str(exc))
            continue
        if w.name in wheels:
            rep.errors.append(
                f"{w.name}: two versions ({wheels[w.name].path.name}, {path.name}); "
                "pip refuses to install both"
            )
            continue
        wheels[w.name] = w
        problem = tags_problem(w, python)
        if problem:
            rep.errors.append(f"{path.name}: {problem}")
    rep.wheels = len(wheels)
    if pins is not None:
        for name, version in pins.items():
            if name not in wheels:
                rep.errors.append(f"{name}=={version}: pinned in gpu_wheels.txt, no wheel for it")
            elif version is not None and Version(wheels[name].version) != Version(version):
                rep.errors.append(f"{name}: wheel {wheels[name].version}, pinned {version}")
        for name in wheels:
            if name not in pins:
                rep.errors.append(f"{wheels[name].path.name}: not in gpu_wheels.txt (stale? rerun make gpu-wheels)")
    env = marker_environment(python)
    for w in wheels.values():
        for text in w.requires:
            req = Requirement(text)
            if not applies(req, env):
                continue
            dep = canonicalize_name(req.name)
            if dep in wheels:
                if not req.specifier.contains(wheels[dep].version, prereleases=True):
                    rep.errors.append(
                        f"{w.name} {w.version} needs {req}; the set has {dep} {wheels[dep].version}"
                    )
                rep.by_set += 1
            elif dep in machine:
                known = machine[dep]
                if known is None:
                    if req.specifier:
                        rep.unchecked.add(f"{dep}{req.specifier}")
                elif not req.specifier.contains(known, prereleases=True):
                    rep.errors.append(f"{w.name} {w.version} needs {req}; the machine has {dep} {known}")
                rep.by_machine += 1
            else:
                rep.errors.append(
                    f"{w.name} {w.version} needs {req}: neither in the set nor on the machine"
                )
    mib = rep.total_bytes / 2**20
    if mib > max_mib:
        rep.errors.append(f"{mib:.1f} MiB of wheels: over {max_mib:g} MiB (64 MiB travel in all)")
    return rep


def tree_bytes(repo: Path) -> int | None:
    """Bytes of the files that travel with the working tree (tracked, and untracked but not
    ignored: what the device tool sends), None outside a git checkout."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=repo, capture_output=True, check=True, timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    total = 0
    for name in out.decode("utf-8", "replace").split("\0"):
        path = repo / name
        if name and path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def check_installed(site: Path) -> Report:
    """On the GPU machine: the requirements of what was installed into ``site``, against the
    distributions really importable now (``site`` must be on sys.path, e.g. via PYTHONPATH)."""
    rep = Report()
    dists = list(importlib.metadata.distributions(path=[str(site)]))
    rep.wheels = len(dists)
    env = {k: str(v) for k, v in default_environment().items()}
    env["extra"] = ""
    for dist in dists:
        name = dist.metadata["Name"]
        for text in dist.requires or []:
            req = Requirement(text)
            if not applies(req, env):
                continue
            try:
                have = importlib.metadata.distribution(req.name)
            except importlib.metadata.PackageNotFoundError:
                rep.errors.append(f"{name} {dist.version} needs {req}: not installed")
                continue
            if Path(str(have.locate_file(""))).resolve() == site.resolve():
                rep.by_set += 1
            else:
                rep.by_machine += 1
            if not req.specifier.contains(have.version, prereleases=True):
                rep.notes.append(f"{name} {dist.version} asks for {req}; found {have.version}")
    return rep


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", nargs="?", default=".gpu-wheels", help="the wheel folder (default .gpu-wheels)")
    parser.add_argument("--pins", default=str(PINS), help="pinned list (default tools/gpu_wheels.txt); '' for none")
    parser.add_argument("--machine", default=str(MACHINE), help="packages on the GPU machine")
    parser.add_argument("--max-mib", type=float, default=MAX_MIB)
    parser.add_argument("--installed", metavar="SITE", help="check an installed site directory instead")
    args = parser.parse_args(argv)
    if args.installed:
        rep = check_installed(Path(args.installed))
        for note in rep.notes:
            print(f"version differs: {note}")
        for err in rep.errors:
            print(f"MISSING: {err}")
        print(
            f"installed set in {args.installed}: {rep.wheels} distributions, requirements met "
            f"{rep.by_set} by the set, {rep.by_machine} by the machine; "
            f"{len(rep.errors)} missing, {len(rep.notes)} with another version than asked"
        )
        return 1 if rep.errors else 0
    pins = read_list(Path(args.pins)) if args.pins else None
    machine = read_list(Path(args.machine))
    rep = check_folder(Path(args.folder), pins, machine, args.max_mib)
    for err in rep.errors:
        print(f"ERROR: {err}")
    if rep.unchecked:
        print(
            "present on the machine, version not known here (checked there by --installed): "
            + ", ".join(sorted(rep.unchecked))
        )
    tree = tree_bytes(TOOLS.parent)
    if tree is not None:
        both = (tree + rep.total_bytes) / 2**20
        print(f"what travels: working tree {tree / 2**20:.1f} MiB + wheels {rep.total_bytes / 2**20:.1f} MiB = {both:.1f} of 64 MiB")
        if both > 60:
            rep.errors.append(f"working tree and wheels together {both:.1f} MiB: too close to the 64 MiB limit")
    verdict = "FAILED" if rep.errors else "ok"
    print(
        f"{args.folder}: {rep.wheels} wheels, {rep.total_bytes / 2**20:.1f} MiB "
        f"(limit {args.max_mib:g}); requirements met {rep.by_set} by the set, "
        f"{rep.by_machine} by the machine's packages; {len(rep.errors)} problems: {verdict}"
    )
    return 1 if rep.errors else 0


if __name__ == "__main__":
    sys.exit(main())
