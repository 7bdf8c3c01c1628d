"""A dry run touches nothing of the user's (issue 25 items 1, 2, 4): files, real tensors however
the cell reaches them, Python objects it mutates, and no fake tensor left behind. Each test runs
the hostile cell through IPython as a user types it, then reads the user's state back."""

from __future__ import annotations

import hashlib
import sys
import textwrap
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

# A module of the user's own (a file outside the Python installation), whose globals a
# method reaches.
LIB = """\
import numpy as np
import torch
BUF = torch.zeros(3)
TABLE = {"n": 0}
ARR = np.arange(3.0)

class Counter:
    def bump(self):
        BUF.add_(1)
        TABLE["n"] += 1
        TABLE["new"] = torch.ones(2)
        ARR[0] = 99.0
"""

SETUP = """\
import os, shutil
from pathlib import Path
import numpy as np
import torch
from torch import nn
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import hostile_lib
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
net(torch.randn(2, 4)).sum().backward()
torch.save(net.state_dict(), "ck.pt")
Path("log.txt").write_text("real log\\n")
np.save("arr.npy", np.arange(4))
os.makedirs("runs/old")
Path("runs/old/a.txt").write_text("a")
w = torch.ones(3)
ARR = np.arange(3.0)
class Cfg:
    w = torch.ones(3)
    calls = 0
LOG = []
class Tracker:
    def log(self, v):
        LOG.append(v)
        Cfg.calls += 1
keep = []
hook = net[0].register_forward_hook(lambda m, i, o: keep.append(o.detach().clone()))
fig, ax = plt.subplots()
ax.plot([1, 2, 3])
"""

# Torch's global switches, compared before and after a dry run: issue 25 item 3 (another
# branch) adds its switches here.
SWITCHES: dict[str, Callable[[], object]] = {
    "grad mode": torch.is_grad_enabled,
    "default dtype": torch.get_default_dtype,
}


@pytest.fixture
def user(ip, run, tmp_path, monkeypatch):
    """The user's session: a folder of files, a module of their own, the SETUP names."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "hostile_lib.py").write_text(LIB)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    sys.modules.pop("hostile_lib", None)
    r = run(SETUP)
    assert r.result.success, r.result.error_in_exec
    ip.user_ns.pop("_memfit", None)
    yield work
    import matplotlib.pyplot as plt

    plt.close("all")
    sys.modules.pop("hostile_lib", None)


def _files(folder) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
        for p in sorted(folder.rglob("*"))
    }


def _tensor_bytes(t) -> tuple:
    grad = t.grad if t.is_leaf else None
    return (
        type(t).__name__, t.dtype, tuple(t.shape), t.requires_grad,
        hashlib.sha256(t.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest(),
        None if grad is None else (type(grad).__name__, hashlib.sha256(grad.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()),
    )


def _snapshot(ns: dict, folder) -> dict:
    from gpumagic.namespace import reachable_tensors, user_items

    lib = sys.modules["hostile_lib"]
    tensors, cut = reachable_tensors(user_items(ns), exclude=[ns])
    assert not cut
    return {
        "files": _files(folder),
        "tensors": {path: _tensor_bytes(t) for path, t in tensors},
        "objects": {
            "LOG": list(ns["LOG"]),
            "Cfg": {k: v for k, v in vars(ns["Cfg"]).items() if not k.startswith("__")},
            "TABLE": dict(lib.TABLE),
            "lib globals": sorted(k for k in vars(lib) if not k.startswith("__")),
            "keep": list(ns["keep"]),
            "ax lines": len(ns["ax"].lines),
            "ARR": ns["ARR"].tobytes(),
            "lib ARR": lib.ARR.tobytes(),
            "names": {k: id(v) for k, v in user_items(ns) if k != "_memfit"},
        },
        "switches": {name: get() for name, get in SWITCHES.items()},
    }


def _fakes_reachable(ns: dict) -> list[str]:
    from torch._subclasses.fake_tensor import FakeTensor

    from gpumagic.namespace import DEEP, user_items, walk

    found = walk(user_items(ns), depth=DEEP, through_code=True, exclude=[ns])
    return [r.path for r in found.reached if isinstance(r.value, FakeTensor)]


def test_a_dry_run_never_writes_deletes_or_renames_a_users_file(ip, run, user):
    before = _files(user)
    r = run(
        "%%memfit --memory 8GiB\n"
        "sd = torch.load('ck.pt')\n"  # reads of real files still work
        "net.load_state_dict(sd)\n"
        "net(torch.randn(8, 4)).sum().backward()\n"
        "torch.save(net.state_dict(), 'ck.pt')\n"
        "open('log.txt', 'a').write('appended\\n')\n"
        "assert open('log.txt').read() == 'real log\\nappended\\n'\n"  # the dry run reads its own write
        "np.save('arr.npy', np.zeros(2))\n"
        "Path('new.bin').write_bytes(b'x')\n"
        "os.rename('log.txt', 'moved.txt')\n"
        "assert open('moved.txt').read().startswith('real log')\n"
        "os.remove('arr.npy')\n"
        "shutil.rmtree('runs')\n"
        "os.makedirs('made/here')\n"
        "Path('made/here/f.txt').write_text('f')\n"
    )
    assert r.result.success, r.result.error_in_exec
    assert _files(user) == before
    assert torch.load("ck.pt").keys() == ip.user_ns["net"].state_dict().keys()
    notes = " ".join(ip.user_ns["_memfit"].notes)
    assert "Your files are untouched" in notes
    assert "line 5: torch.save(..., 'ck.pt') was skipped" in notes
    assert "line 6: open('log.txt', 'a') wrote to a scratch copy" in notes
    assert "line 10: os.rename('log.txt', 'moved.txt') was not done" in notes
    assert "line 12: os.remove('arr.npy') was not done" in notes
    assert "line 13: shutil.rmtree('runs') was not done" in notes


def test_a_dry_run_never_changes_a_real_tensor_however_the_cell_reaches_it(ip, run, user):
    ns = ip.user_ns
    lib = sys.modules["hostile_lib"]
    r = run(
        "%%memfit --memory 8GiB\n"
        "get_ipython().user_ns['w'].mul_(0)\n"  # in place, every input real
        "Cfg.w.mul_(0)\n"
        "hostile_lib.Counter().bump()\n"  # a module global through a method
        "Tracker().log(1)\n"
        "get_ipython().user_ns['net'](torch.randn(2, 4)).sum().backward()\n"
        "plt.gca().plot([4, 5])\n"
    )
    assert r.result.success, r.result.error_in_exec
    assert torch.equal(ns["w"], torch.ones(3))
    assert torch.equal(ns["Cfg"].w, torch.ones(3))
    assert torch.equal(lib.BUF, torch.zeros(3))
    assert lib.TABLE == {"n": 0}
    assert lib.ARR.tolist() == [0.0, 1.0, 2.0]
    assert ns["LOG"] == [] and ns["Cfg"].calls == 0
    assert len(ns["ax"].lines) == 1
    for p in ns["net"].parameters():
        assert type(p.grad) is torch.Tensor
    assert not _fakes_reachable(ns)


def test_a_forward_hook_leaves_no_fake_tensor_behind(ip, run, user):
    r = run("%%memfit --memory 8GiB\nout = net(torch.randn(2, 4))\n")
    assert r.result.success, r.result.error_in_exec
    assert ip.user_ns["keep"] == []
    assert not _fakes_reachable(ip.user_ns)
    # the hook still works in the real run that follows
    r = run("out = net(torch.randn(2, 4))")
    assert r.result.success and len(ip.user_ns["keep"]) == 1
    assert type(ip.user_ns["keep"][0]) is torch.Tensor


HOSTILE = textwrap.dedent(
    """\
    %%memfit --memory 8GiB
    sd = torch.load('ck.pt')
    x = torch.randn(8, 4)
    loss = net(x).sum()
    loss.backward()
    get_ipython().user_ns['w'].mul_(0)
    get_ipython().user_ns['net'][0].weight.data.zero_()
    get_ipython().user_ns['net'][2].bias.grad = None
    Cfg.w.add_(Cfg.w)
    hostile_lib.Counter().bump()
    Tracker().log(x)
    plt.gca().plot([4, 5])
    torch.save({'net': net.state_dict()}, 'ck.pt')
    np.save('arr.npy', np.zeros(9))
    open('log.txt', 'w').write('gone')
    Path('runs/old/a.txt').unlink()
    os.replace('ck.pt', 'ck2.pt')
    shutil.move('runs', 'runs2')
    """
)


def test_a_hostile_dry_run_leaves_files_tensors_objects_and_switches_identical(ip, run, user):
    before = _snapshot(ip.user_ns, user)
    assert before["tensors"], "the snapshot reads the user's tensors"
    r = run(HOSTILE)
    assert r.result.success, r.result.error_in_exec
    after = _snapshot(ip.user_ns, user)
    for part in ("files", "tensors", "objects", "switches"):
        assert after[part] == before[part], part
    assert not _fakes_reachable(ip.user_ns)
