"""The dry run's files: what a cell writes, deletes or renames happens in a scratch folder
thrown away after, never to the user's files (issue 25 item 1: a dry run of a cell that ends
in ``torch.save(..., 'ck.pt')`` destroyed the real checkpoint).

One design, an overlay: the dry run sees the user's files through a table of the paths it
changed. Reads of a path it did not change read the real file (a cell that ``torch.load``'s
a checkpoint, then trains, works); the rest is done in the scratch folder:

* a write (``open`` with ``w``, ``a``, ``x`` or ``+``, ``Path.open/write_text/write_bytes``,
  ``os.open`` with a write flag, ``np.save``, which opens through ``open``) goes to the
  path's copy in the scratch folder (for ``a`` and ``+``, the real content copied there
  first); later reads in the same dry run read that copy;
* ``torch.save`` and ``safetensors``' ``save_file`` to a path are skipped: the tensors are
  fake and have no values to write (torch cannot pickle them). Their file writers, which
  open the path in C++ or Rust, are pointed at the scratch folder too, for a save reached
  some other way (``from torch import save``);
* a delete (``os.remove/unlink/rmdir``, ``shutil.rmtree``, ``Path.unlink/rmdir``) marks the
  path gone for the rest of the dry run; a rename or move (``os.rename/replace``,
  ``shutil.move``, ``Path.rename/replace``) makes the new path read the old one's content and
  the old one gone; ``os.mkdir/makedirs`` (``Path.mkdir``) makes the folder in the scratch.

Only ``open``/``os.open`` read through the table: ``os.path.exists``, ``os.listdir`` and
``os.stat`` see the real files. Only the thread running the dry run is redirected (a
``%gpuwatch`` log written by its own thread meanwhile is written for real). Each redirected
statement is noted with its line, the operation and the path, and what was done instead.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# os.open flags that write
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


@dataclass
class FileOverlay:
    """The table of paths a dry run changed (absolute path -> the file to read for it, None
    when the dry run deleted it), its scratch folder, and what it did instead, by statement."""

    where: Callable[[], int]
    scratch: str = ""
    view: dict[str, str | None] = field(default_factory=dict)
    done: list[tuple[int, str]] = field(default_factory=list)  # (statement, what was done instead)
    thread: int = 0

    def note(self, what: str) -> None:
        entry = (self.where(), what)
        if entry not in self.done:
            self.done.append(entry)

    def ours(self, path: str) -> bool:
        """Whether to redirect ``path``: a path named (not a descriptor), outside the scratch
        folder (the overlay's own copies), in the thread running the dry run."""
        return (
            threading.get_ident() == self.thread
            and not (path + os.sep).startswith(self.scratch + os.sep)
        )

    def resolve(self, path: str) -> str | None:
        """The file the dry run reads for ``path`` (absolute): its own copy, the real one, or
        None (it deleted it, or a folder above it)."""
        probe = path
        while True:
            if probe in self.view:
                target = self.view[probe]
                if target is None:
                    return None
                rest = os.path.relpath(path, probe)
                return target if rest == "." else os.path.join(target, rest)
            parent = os.path.dirname(probe)
            if parent == probe:
                return path
            probe = parent

    def mirror(self, path: str) -> str:
        """``path``'s place in the scratch folder, its folder made."""
        copy = os.path.join(self.scratch, path.lstrip(os.sep))
        _REAL["makedirs"](os.path.dirname(copy), exist_ok=True)
        return copy

    def for_write(self, path: str, keep_content: bool) -> str:
        """Where a write of ``path`` goes: its scratch copy (with the content the dry run sees
        now when ``keep_content``)."""
        current = self.resolve(path)
        copy = self.mirror(path)
        if current != copy:
            if keep_content and current is not None and os.path.isfile(current):
                _REAL["copyfile"](current, copy)
            elif os.path.isdir(copy):
                _REAL["rmtree"](copy)
            elif os.path.exists(copy):
                _REAL["remove"](copy)
        self.view[path] = copy
        return copy


# The functions replaced while a dry run lasts, as they were before any replacing.
_REAL: dict[str, Any] = {
    "open": builtins.open,
    "os.open": os.open,
    "makedirs": os.makedirs,
    "copyfile": shutil.copyfile,
    "rmtree": shutil.rmtree,
    "remove": os.remove,
}


def _path(file: Any) -> str | None:
    """The absolute path ``file`` names, or None (a descriptor, a file object)."""
    if isinstance(file, (str, bytes, os.PathLike)):
        name = os.fsdecode(os.fspath(file))
        return os.path.abspath(name)
    return None


def _shown(file: Any) -> str:
    return repr(os.fsdecode(os.fspath(file))) if isinstance(file, (str, bytes, os.PathLike)) else repr(file)


@contextlib.contextmanager
def scratch_files(where: Callable[[], int]) -> Iterator[FileOverlay]:
    """While it lasts, the running thread's writes, deletes and renames go to a scratch
    folder (see the module docstring), removed at the end; ``where()``: the statement
    running, for the notes."""
    overlay = FileOverlay(where, tempfile.mkdtemp(prefix="gpumagic-dryrun-"), thread=threading.get_ident())
    patches = _patches(overlay)
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, new in patches:
            setattr(owner, name, new)
        yield overlay
    finally:
        for owner, name, old in reversed(saved):
            setattr(owner, name, old)
        _REAL["rmtree"](overlay.scratch, ignore_errors=True)


def _patches(o: FileOverlay) -> list[tuple[Any, str, Any]]:
    """(owner, attribute, replacement) for each function a dry run replaces."""
    open_, os_open = _opens(o)
    patches: list[tuple[Any, str, Any]] = [
        (builtins, "open", open_),
        (io, "open", open_),  # pathlib opens through io.open
        (os, "open", os_open),
    ]
    # IPython gives a notebook its own `open`, which calls the io.open it imported at start
    shell = sys.modules.get("IPython.core.interactiveshell")
    if shell is not None and getattr(shell, "io_open", None) is _REAL["open"]:
        patches.append((shell, "io_open", open_))
    for name in ("remove", "unlink", "rmdir"):
        patches.append((os, name, _gone(o, f"os.{name}", getattr(os, name))))
    patches.append((shutil, "rmtree", _gone(o, "shutil.rmtree", shutil.rmtree)))
    for name in ("rename", "replace"):
        patches.append((os, name, _moved(o, f"os.{name}", getattr(os, name))))
    patches.append((shutil, "move", _moved(o, "shutil.move", shutil.move)))
    patches.append((os, "mkdir", _made(o, "os.mkdir", os.mkdir)))
    patches.append((os, "makedirs", _made(o, "os.makedirs", os.makedirs)))
    patches.extend(_serializers(o))
    return patches


def _opens(o: FileOverlay) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``open`` and ``os.open`` through the overlay."""
    real_open, real_os_open = _REAL["open"], _REAL["os.open"]

    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        path = _path(file)
        if path is None or not o.ours(path):
            return real_open(file, mode, *args, **kwargs)
        if any(c in mode for c in "wax+"):
            if "x" in mode and o.resolve(path) is not None and os.path.exists(o.resolve(path) or ""):
                raise FileExistsError(17, "File exists", os.fsdecode(os.fspath(file)))
            target = o.for_write(path, keep_content=("a" in mode or "+" in mode) and "w" not in mode)
            o.note(f"open({_shown(file)}, {mode!r}) wrote to a scratch copy")
            return real_open(target, mode, *args, **kwargs)
        return real_open(_readable(o, path, file), mode, *args, **kwargs)

    def os_open(file: Any, flags: int, *args: Any, **kwargs: Any) -> Any:
        path = _path(file)
        if path is None or not o.ours(path) or kwargs.get("dir_fd") is not None:
            return real_os_open(file, flags, *args, **kwargs)
        if flags & _WRITES:
            target = o.for_write(path, keep_content=not flags & os.O_TRUNC)
            o.note(f"os.open({_shown(file)}) for writing went to a scratch copy")
            return real_os_open(target, flags, *args, **kwargs)
        return real_os_open(_readable(o, path, file), flags, *args, **kwargs)

    return open_, os_open


def _gone(o: FileOverlay, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def remove(file: Any, *args: Any, **kwargs: Any) -> Any:
        path = _path(file)
        if path is None or not o.ours(path) or kwargs.get("dir_fd") is not None:
            return real(file, *args, **kwargs)
        current = o.resolve(path)
        if current is None or not os.path.lexists(current):
            raise FileNotFoundError(2, "No such file or directory", os.fsdecode(os.fspath(file)))
        o.view[path] = None
        o.note(f"{name}({_shown(file)}) was not done: the path is gone for the rest of the dry run only")
        return None

    return remove

def _moved(o: FileOverlay, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def move(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
        a, b = _path(src), _path(dst)
        if a is None or b is None or not o.ours(a):
            return real(src, dst, *args, **kwargs)
        current = o.resolve(a)
        if current is None or not os.path.lexists(current):
            raise FileNotFoundError(2, "No such file or directory", os.fsdecode(os.fspath(src)))
        target = o.resolve(b)
        if name == "shutil.move" and target is not None and os.path.isdir(target):
            b = os.path.join(b, os.path.basename(a))
        o.view[b] = current
        o.view[a] = None
        o.note(f"{name}({_shown(src)}, {_shown(dst)}) was not done: the dry run reads the new path from the old")
        return os.fsdecode(os.fspath(dst)) if name == "shutil.move" else None

    return move

def _made(o: FileOverlay, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def mkdir(file: Any, *args: Any, **kwargs: Any) -> Any:
        path = _path(file)
        if path is None or not o.ours(path) or kwargs.get("dir_fd") is not None:
            return real(file, *args, **kwargs)
        current = o.resolve(path)
        if current is not None and os.path.isdir(current):
            if name == "os.mkdir" or not kwargs.get("exist_ok", len(args) > 1 and args[1]):
                raise FileExistsError(17, "File exists", os.fsdecode(os.fspath(file)))
            return None
        copy = o.mirror(path)
        _REAL["makedirs"](copy, exist_ok=True)
        o.view[path] = copy
        o.note(f"{name}({_shown(file)}) made the folder in the scratch folder")
        return None

    return mkdir

def _skipped(o: FileOverlay, name: str, real: Callable[..., Any], position: int) -> Callable[..., Any]:
    def save(*args: Any, **kwargs: Any) -> Any:
        file = args[position] if len(args) > position else kwargs.get("f", kwargs.get("filename"))
        path = _path(file)
        if path is None or not o.ours(path):
            return real(*args, **kwargs)
        o.note(f"{name}(..., {_shown(file)}) was skipped: a dry run saves no tensors (its own are fake, with no values)")
        return None

    return save

def _writer(o: FileOverlay, name: str, real: Callable[..., Any], position: int) -> Callable[..., Any]:
    def write(*args: Any, **kwargs: Any) -> Any:
        path = _path(args[position]) if len(args) > position else None
        if path is None or not o.ours(path):
            return real(*args, **kwargs)
        target = o.for_write(path, keep_content=False)
        o.note(f"{name} to {_shown(args[position])} wrote to a scratch copy")
        new = list(args)
        new[position] = target
        return real(*new, **kwargs)

    return write



def _readable(o: FileOverlay, path: str, file: Any) -> str:
    current = o.resolve(path)
    if current is None:
        raise FileNotFoundError(2, "No such file or directory", os.fsdecode(os.fspath(file)))
    return current


def _serializers(o: FileOverlay) -> list[tuple[Any, str, Any]]:
    """torch's and safetensors' saves: skipped at the call a cell makes, and their writers
    (which open the path in C++ or Rust, out of ``open``'s reach) pointed at the scratch."""
    out: list[tuple[Any, str, Any]] = []
    serialization = sys.modules.get("torch.serialization")
    torch = sys.modules.get("torch")
    if serialization is not None and torch is not None:
        out.append((torch, "save", _skipped(o, "torch.save", torch.save, 1)))
        out.append((serialization, "save", _skipped(o, "torch.save", serialization.save, 1)))
        out.append((serialization, "_open_zipfile_writer_file",
                    _writer(o, "torch.save", serialization._open_zipfile_writer_file, 0)))
    for name in ("safetensors.torch", "safetensors.numpy"):
        module = sys.modules.get(name)
        if module is None:
            continue
        if hasattr(module, "save_file"):
            out.append((module, "save_file", _skipped(o, f"{name}.save_file", module.save_file, 1)))
        if hasattr(module, "serialize_file"):
            out.append((module, "serialize_file", _writer(o, f"{name}.save_file", module.serialize_file, 1)))
    return out


def file_notes(done: list[tuple[int, str]], line: Callable[[int], str]) -> list[str]:
    """The report's note on files: each statement that wrote, deleted or renamed, and what
    was done instead (``line``: a statement's index as the report names it)."""
    if not done:
        return []
    shown = "; ".join(f"{line(s)}: {what}" for s, what in done)  # every one: what the user's files were spared
    return [
        "Your files are untouched: the dry run's writes, deletes and renames went to a scratch "
        f"folder, removed after. {shown}."
    ]


__all__ = ["FileOverlay", "file_notes", "scratch_files"]
