"""The one namespace walker (gpumagic.namespace): what it reads of a user's namespace, what it
never runs, how far it goes, and the question a dry run asks of it (every real tensor a cell
can reach, with a path). Hostile objects record every call the rules forbid; the walker must
leave each record empty."""

from __future__ import annotations

import sys
import textwrap
import warnings

import pytest

torch = pytest.importorskip("torch")

from gpumagic.namespace import (  # noqa: E402
    ITEMS,
    SMALL,
    history,
    is_a,
    module_tensors,
    reachable_tensors,
    small_items,
    small_values,
    user_items,
    walk,
)

HOSTILE = '''
import torch
touched = []

class Hostile:
    """Every protocol a scan could run raises, and says that it ran."""
    def __init__(self, inside):
        self.inside = inside  # an attribute: the walk may read it, without running anything
    @property
    def __class__(self):
        touched.append("__class__")
        return torch.Tensor  # a lying proxy: isinstance(self, torch.Tensor) is True
    def __getattr__(self, name):
        touched.append("__getattr__ " + name)
        raise AttributeError(name)
    @property
    def computed(self):
        touched.append("property")
        return torch.ones(3)
    def __eq__(self, other):
        touched.append("__eq__"); raise RuntimeError("eq")
    def __hash__(self):
        touched.append("__hash__"); raise RuntimeError("hash")
    def __len__(self):
        touched.append("__len__"); raise RuntimeError("len")
    def __iter__(self):
        touched.append("__iter__"); raise RuntimeError("iter")
    def __bool__(self):
        touched.append("__bool__"); raise RuntimeError("bool")

class HostileList(list):
    def __len__(self):
        touched.append("list.__len__"); raise RuntimeError("len")
    def __iter__(self):
        touched.append("list.__iter__"); raise RuntimeError("iter")
    def __getitem__(self, i):
        touched.append("list.__getitem__"); raise RuntimeError("getitem")

class HostileDict(dict):
    def items(self):
        touched.append("dict.items"); raise RuntimeError("items")
    def values(self):
        touched.append("dict.values"); raise RuntimeError("values")
    def __len__(self):
        touched.append("dict.__len__"); raise RuntimeError("len")

class OwnDict:
    """A class that defines its own __dict__: the class's code, never run."""
    @property
    def __dict__(self):
        touched.append("__dict__"); raise RuntimeError("dict")

kept = torch.ones(5)
proxy = Hostile(torch.ones(14))
hostile_list = HostileList([torch.ones(6)])
hostile_dict = HostileDict(k=torch.ones(7))
own_dict = OwnDict()
'''


def test_hostile_objects_run_nothing_and_are_read_by_their_real_type(ip):
    assert ip.run_cell(HOSTILE).success
    ns = ip.user_ns
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not is_a(ns["proxy"], torch.Tensor)  # isinstance would say it is one
        one_level = {name: list(small_items(value)) for name, value in user_items(ns)}
        found = walk(user_items(ns), depth=4, through_code=True, exclude=[ns])
        tensors, _ = reachable_tensors(user_items(ns), exclude=[ns])
    assert ns["touched"] == []
    assert isinstance(ns["proxy"], torch.Tensor) and ns["touched"] == ["__class__"]  # the lie
    paths = {path for path, _ in tensors}
    # what they hold is still found, through the built-in types' own methods
    assert {"kept", "hostile_list[0]", "hostile_dict['k']"} <= paths
    assert [s for s, _ in one_level["hostile_list"]] == ["[0]"]
    assert [s for s, _ in one_level["hostile_dict"]] == ["['k']"]
    # the proxy's attribute is read from its __dict__; no row for what its property computes
    assert "proxy.inside" in paths and any(r.path == "proxy.inside" for r in found.reached)
    assert not any(r.path.startswith("proxy.computed") for r in found.reached)


def test_ipython_names_and_private_names_are_not_the_users(ip):
    ip.run_cell("import torch\nx = torch.ones(2)\n_hidden = torch.ones(3)\n", store_history=True)
    ip.run_cell("torch.ones(4)", store_history=True)  # now in Out and _
    names = {name for name, _ in user_items(ip.user_ns)}
    assert "x" in names and "torch" in names
    assert not names & {"In", "Out", "exit", "quit", "get_ipython", "_", "_hidden", "_i1"}
    kept = history(ip.user_ns)
    assert any(is_a(v, torch.Tensor) and v.numel() == 4 for v in kept)
    tensors, _ = reachable_tensors(user_items(ip.user_ns), exclude=[ip.user_ns])
    assert {p for p, _ in tensors} >= {"x"} and not any(p.startswith("_") for p, _ in tensors)


def test_one_level_reads_only_small_containers():
    small = [torch.ones(1)] * SMALL
    large = [torch.ones(1)] * (SMALL + 1)
    assert len(small_values(small)) == SMALL and small_values(large) == ()
    assert small_values({"a": 1}) == [1] and small_values((1, 2)) == (1, 2)
    assert small_values("a string") == () and small_values(torch.ones(2)) == ()
    named = type("Pair", (tuple,), {})((torch.ones(1), 2))  # a tuple subclass: its items
    assert len(small_values(named)) == 2


def test_a_walk_is_bounded_and_says_where():
    roots = [("many", [torch.ones(1) for _ in range(ITEMS + 5)])]
    found = walk(roots, depth=2)
    assert sum(1 for r in found.reached if is_a(r.value, torch.Tensor)) == ITEMS
    assert found.cut == [f"many: the first {ITEMS:,} of {ITEMS + 5:,} items"]
    deep = [[[[[torch.ones(1)]]]]]
    assert not any(is_a(r.value, torch.Tensor) for r in walk([("d", deep)], depth=3).reached)
    assert any(is_a(r.value, torch.Tensor) for r in walk([("d", deep)], depth=5).reached)
    capped = walk([("many", roots[0][1])], objects=10)
    assert len(capped.reached) == 10 and capped.cut[-1] == "the walk stopped at 10 objects"


def test_a_models_tensors_are_read_from_its_tables_not_its_methods():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(2, 3)
            self.register_buffer("scale", torch.ones(1))

        def parameters(self, recurse=True):
            raise RuntimeError("no parameters today")

        def named_parameters(self, *a, **k):
            raise RuntimeError("no parameters today")

    found = [(name, role) for name, role, _ in module_tensors(Odd())]
    assert found == [("fc.weight", "parameter"), ("fc.bias", "parameter"), ("scale", "buffer")]
    seq = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    expected = [n for n, _ in seq.named_parameters()] + [n for n, _ in seq.named_buffers()]
    assert [name for name, _, _ in module_tensors(seq)] == expected


MYLIB = '''
import torch
BUF = torch.zeros(3)
_CACHE = {"w": torch.zeros(4)}
def bump():
    BUF.add_(1)
class Holder:
    shared = torch.ones(5)
'''

CELL = '''
import torch
import functools
import mylib_for_walk as mylib
from torch import nn

class Cfg:
    w = torch.ones(2)
class Sub(Cfg):
    pass

class Trainer:
    def __init__(self, model, opt):
        self.model, self.opt = model, opt
        self.batches = {"train": [torch.ones(8)]}

def make_step(scale=torch.ones(9)):
    held = torch.ones(10)
    def step():
        return held * 2
    return step

net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
opt = torch.optim.Adam(net.parameters())
net(torch.ones(2, 4)).sum().backward()
opt.step()
trainer = Trainer(net, opt)
step = make_step()
bump = mylib.bump
shared = mylib.Holder()
sub = Sub
pieces = {torch.ones(11)}
part = functools.partial(print, torch.ones(12))
relu = torch.nn.functional.relu
view = torch.ones(13)[:2]
'''


def test_every_real_tensor_a_cell_can_reach_has_a_path(ip, tmp_path, monkeypatch):
    (tmp_path / "mylib_for_walk.py").write_text(textwrap.dedent(MYLIB))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert ip.run_cell(CELL).success
        ns = ip.user_ns
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            tensors, cut = reachable_tensors(user_items(ns), exclude=[ns])
        assert cut == []
        paths = {path: t for path, t in tensors}
        net = ns["net"]
        expected = {
            "net.0.weight": net[0].weight,  # a model's parameters, by the names torch gives
            "net.0.weight.grad": net[0].weight.grad,
            "opt.state[net.0.weight]['exp_avg']": ns["opt"].state[net[0].weight]["exp_avg"],
            "trainer.batches['train'][0]": ns["trainer"].batches["train"][0],  # an attribute
            "step.__closure__[0].cell_contents": ns["step"].__closure__[0].cell_contents,
            "make_step.__defaults__[0]": ns["make_step"].__defaults__[0],
            "Cfg.w": ns["Cfg"].w,  # a class attribute, reached through a subclass too
            "mylib_for_walk.BUF": sys.modules["mylib_for_walk"].BUF,  # a module global, via a function
            "mylib_for_walk._CACHE['w']": sys.modules["mylib_for_walk"]._CACHE["w"],
            "mylib_for_walk.Holder.shared": sys.modules["mylib_for_walk"].Holder.shared,
            "list(pieces)[0]": next(iter(ns["pieces"])),
            "part.args[0]": ns["part"].args[0],
            "view._base": ns["view"]._base,
        }
        for path, t in expected.items():
            assert paths.get(path) is t, (path, sorted(paths))
        assert len({id(t) for t in paths.values()}) == len(paths)  # each tensor once
        # torch's own globals are a library's, not the user's: relu leads nowhere
        assert not any(p.startswith(("relu", "torch.")) for p in paths)
    finally:
        sys.modules.pop("mylib_for_walk", None)


def test_fake_tensors_are_not_real_ones():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(10**6)
    real = torch.ones(1)
    tensors, _ = reachable_tensors([("fake", fake), ("real", real)])
    assert [p for p, _ in tensors] == ["real"]


def test_what_is_excluded_is_never_reached_however_it_is_given():
    kept = torch.ones(2)
    held = {"kept": kept, "other": torch.ones(3)}
    for exclude in ([kept], (t for t in [kept])):
        paths = {p for p, _ in reachable_tensors([("held", held)], exclude=exclude)[0]}
        assert paths == {"held['other']"}
