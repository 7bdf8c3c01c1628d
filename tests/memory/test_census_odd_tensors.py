"""A tensor the census cannot read the ordinary way never stops a %%memtrace cell (issue 25
items 7 and 8): what it holds in storages is counted exactly (a sparse tensor's indices and
values, what functorch wraps, a DTensor's local shard, a nested tensor's buffer and sizes), a
fake tensor holds nothing, and what cannot be counted (an mkldnn tensor, a subclass with a
dispatch of its own) is named in a note. Through IPython, as a user types it."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _torch_in_namespace(ip):
    ip.user_ns["torch"] = torch
    ip.user_ns["nn"] = torch.nn
    warnings.filterwarnings("ignore", message=".*nested tensors is in prototype.*")


def _nbytes(*tensors):
    """Bytes of the distinct storages behind ``tensors`` (each a plain strided tensor)."""
    seen = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _traced_z(ip, run):
    """%%memtrace on one ordinary statement; its row."""
    r = run("%%memtrace -q\nz = torch.ones(10)\n")
    assert r.result.success, r.result.error_in_exec
    assert torch.equal(ip.user_ns["z"], torch.ones(10))  # the cell ran
    t = ip.user_ns["_memtrace"]
    return t, t.lines.set_index("line").loc[2]


def _coo(ns):
    sp = ns["sp"]
    return _nbytes(sp._indices(), sp._values())


def _csr(ns):
    sp = ns["sp"]
    return _nbytes(sp.crow_indices(), sp.col_indices(), sp.values())


def _embedding(ns):
    emb = ns["emb"]
    g = emb.weight.grad
    assert g.layout == torch.sparse_coo
    return emb.weight.nbytes + _nbytes(g._indices(), g._values())


def _nested(ns):
    sp = ns["sp"]
    meta = (sp._nested_tensor_size(), sp._nested_tensor_strides(), sp._nested_tensor_storage_offsets())
    return sp.untyped_storage().nbytes() + _nbytes(*meta)


def _jagged(ns):
    sp = ns["sp"]
    return _nbytes(sp.values(), sp.offsets())


def _per_channel(ns):
    sp = ns["sp"]
    return sp.untyped_storage().nbytes() + _nbytes(sp.q_per_channel_scales(), sp.q_per_channel_zero_points())


# (setup cell, the bytes its tensors hold, computed from torch's own accessors)
COUNTED = {
    "sparse_coo": ("sp = torch.ones(3).to_sparse()", _coo),
    "sparse_csr": ("sp = torch.eye(3).to_sparse_csr()", _csr),
    "embedding_sparse_grad": (
        "emb = nn.Embedding(10, 3, sparse=True)\nemb(torch.tensor([1, 2])).sum().backward()",
        _embedding,
    ),
    "leaked_from_func_grad": (
        "leak = []\n"
        "def f(x):\n"
        "    leak.append(x)\n"
        "    return x.sin().sum()\n"
        "g = torch.func.grad(f)(torch.ones(5))\n",
        lambda ns: ns["g"].nbytes + 5 * 4,  # g, and the input the leaked wrapper wraps
    ),
    "leaked_from_vmap": (
        "leak = []\ng = torch.vmap(lambda x: leak.append(x) or x * 2)(torch.ones(2, 3))",
        lambda ns: ns["g"].nbytes + 2 * 3 * 4,
    ),
    "nested": ("sp = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])", _nested),
    "nested_jagged": (
        "sp = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)",
        _jagged,
    ),
    "quantized_per_channel": (
        "sp = torch.quantize_per_channel(torch.ones(4, 3), torch.ones(4), "
        "torch.zeros(4, dtype=torch.long), 0, torch.qint8)",
        _per_channel,
    ),
    "meta": ("sp = torch.ones(1000, device='meta')", lambda ns: 0),
    "subclass_whose_untyped_storage_raises": (
        "class Stubborn(torch.Tensor):\n"
        "    def untyped_storage(self):\n"
        "        raise RuntimeError('no storage for you')\n"
        "sp = torch.ones(100).as_subclass(Stubborn)",
        lambda ns: 400,
    ),
    "subclass_whose_torch_function_raises": (
        "class Touchy(torch.Tensor):\n"
        "    @classmethod\n"
        "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
        "        raise RuntimeError('do not touch')\n"
        "sp = torch.ones(100).as_subclass(Touchy)",
        lambda ns: 400,
    ),
    "torch_wrapper_subclass": (
        "from torch.testing._internal.two_tensor import TwoTensor\n"
        "sp = TwoTensor(torch.ones(100), torch.ones(100))",
        lambda ns: 800,
    ),
}


@pytest.mark.parametrize("case", list(COUNTED))
def test_what_an_odd_tensor_holds_is_counted_exactly_and_the_cell_runs(ip, run, case):
    setup, expected = COUNTED[case]
    r = run(setup)
    assert r.result.success, r.result.error_in_exec
    held = expected(ip.user_ns)
    t, row = _traced_z(ip, run)
    assert row.delta_bytes == 40 and row.peak_bytes == 40
    assert row.allocated_bytes == held + 40
    assert not any("census" in n for n in t.notes), t.notes


def test_a_dtensor_counts_its_local_shard(ip, run):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed, not initialised yet")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        r = run(
            "from torch.distributed.device_mesh import init_device_mesh\n"
            "from torch.distributed.tensor import Shard, distribute_tensor\n"
            "d = distribute_tensor(torch.ones(64), init_device_mesh('cpu', (1,)), [Shard(0)])\n"
        )
        assert r.result.success, r.result.error_in_exec
        _, row = _traced_z(ip, run)
        assert row.allocated_bytes == 64 * 4 + 40
        r = run("%%memtrace -q\ne = d * 2\n")  # an op on DTensors: the new local shard counts
        assert r.result.success, r.result.error_in_exec
        assert ip.user_ns["_memtrace"].lines.set_index("line").loc[2, "delta_bytes"] == 64 * 4
    finally:
        ip.user_ns.pop("d", None)
        ip.user_ns.pop("e", None)
        dist.destroy_process_group()


UNCOUNTABLE = {
    "mkldnn": ("sp = torch.ones(1000).to_mkldnn()", "mkldnn"),
    "wrapper_subclass_of_the_users": (
        "class Lazy(torch.Tensor):\n"
        "    @staticmethod\n"
        "    def __new__(cls, a):\n"
        "        return torch.Tensor._make_wrapper_subclass(cls, a.shape, dtype=a.dtype)\n"
        "    def __init__(self, a):\n"
        "        self.a = a\n"
        "    @classmethod\n"
        "    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):\n"
        "        raise RuntimeError('not here')\n"
        "sp = Lazy(torch.ones(1000))",
        "Lazy",
    ),
}


@pytest.mark.parametrize("case", list(UNCOUNTABLE))
def test_what_cannot_be_counted_is_named_in_a_note(ip, run, case):
    setup, why = UNCOUNTABLE[case]
    assert run(setup).result.success
    t, row = _traced_z(ip, run)
    assert row.delta_bytes == 40
    note = next(n for n in t.notes if "cannot count" in n)
    assert "sp (" in note and why in note


def test_odd_tensors_made_inside_the_cell_are_counted_and_the_census_goes_on(ip, run):
    r = run(
        "%%memtrace -q\n"
        "sp = torch.ones(1000).to_sparse()\n"
        "mk = torch.ones(1000).to_mkldnn()\n"
        "csr = torch.eye(30).to_sparse_csr()\n"
        "y = torch.ones(10)\n"
    )
    assert r.result.success, r.result.error_in_exec
    t = ip.user_ns["_memtrace"]
    rows = t.lines.set_index("line")
    sp, csr = ip.user_ns["sp"], ip.user_ns["csr"]
    assert rows.loc[2, "delta_bytes"] == _nbytes(sp._indices(), sp._values()) == 12_000
    assert rows.loc[4, "delta_bytes"] == _nbytes(csr.crow_indices(), csr.col_indices(), csr.values())
    assert rows.loc[5, "delta_bytes"] == 40  # still counting after the mkldnn tensor
    assert not any("census stopped" in n for n in t.notes), t.notes
    assert any("to_mkldnn" in n and "mkldnn tensor" in n for n in t.notes), t.notes


def test_a_fake_tensor_in_the_namespace_holds_no_memory(ip, run):
    """Issue 25 item 8: the start-up scan took a FakeTensor for 4 GB of real memory."""
    r = run(
        "from torch._subclasses.fake_tensor import FakeTensorMode\n"
        "with FakeTensorMode():\n"
        "    xf = torch.empty(10**9)\n"
    )
    assert r.result.success, r.result.error_in_exec
    t, row = _traced_z(ip, run)
    assert row.allocated_bytes == 40 and row.inputs_bytes == 40
    assert t.at_peak.total == 40
