"""``%%memfit`` through a real IPython shell on real torch (CPU): what it stores and shows, the
traps of a dry run (each a stated approximation or a message naming the line, and the next
cell runs), and the namespace left byte for byte as it was."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

SETUP = """\
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 10))
optimizer = torch.optim.Adam(model.parameters())
model(torch.randn(2, 3, 16, 16)).sum().backward()
optimizer.step()
losses = []
B = 16
"""

STEP = """\
x = torch.randn(B, 3, 16, 16)
y = torch.randint(0, 10, (B,))
loss = torch.nn.functional.cross_entropy(model(x), y)
loss.backward()
optimizer.step()
optimizer.zero_grad()
losses.append(loss.item())
"""


@pytest.fixture
def ns(ip, run):
    r = run(SETUP)
    assert r.result.success, r.result.error_in_exec
    ip.user_ns.pop("_memfit", None)
    return ip.user_ns


def _snapshot(ns: dict) -> dict:
    model, opt = ns["model"], ns["optimizer"]
    state = {
        (i, k): v.clone() if isinstance(v, torch.Tensor) else v
        for i, s in enumerate(opt.state.values())
        for k, v in s.items()
    }
    return {
        "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "grads": [p.grad.clone() if p.grad is not None else None for p in model.parameters()],
        "param_ids": [id(p) for p in model.parameters()],
        "state": state,
        "torch_rng": torch.get_rng_state().clone(),
        "random": random.getstate(),
        "numpy": np.random.get_state()[1].copy(),
        "names": {k: id(v) for k, v in ns.items() if not k.startswith("_") and k != "fit"},
        "losses": list(ns["losses"]),
        "grad_mode": torch.is_grad_enabled(),
    }


def _same(a: dict, b: dict) -> None:
    assert a["params"].keys() == b["params"].keys()
    for k in a["params"]:
        assert torch.equal(a["params"][k], b["params"][k]), k
        assert a["params"][k].dtype == b["params"][k].dtype
    for ga, gb in zip(a["grads"], b["grads"]):
        assert (ga is None and gb is None) or torch.equal(ga, gb)
    assert a["param_ids"] == b["param_ids"]
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        va, vb = a["state"][k], b["state"][k]
        assert torch.equal(va, vb) if isinstance(va, torch.Tensor) else va == vb, k
    assert torch.equal(a["torch_rng"], b["torch_rng"])
    assert a["random"] == b["random"]
    assert (a["numpy"] == b["numpy"]).all()
    assert a["names"] == b["names"]
    assert a["losses"] == b["losses"]
    assert a["grad_mode"] == b["grad_mode"]


def _no_fakes(ns: dict) -> None:
    from torch._subclasses.fake_tensor import FakeTensor

    for name, value in ns.items():
        if name.startswith("_") and name != "_memfit":
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        assert not any(isinstance(v, FakeTensor) for v in values), name


def test_prediction_is_stored_shown_and_the_namespace_unchanged(ip, run, ns):
    before = _snapshot(ns)
    r = run("%%memfit --gpu T4\n" + STEP)
    assert r.result.success, r.result.error_in_exec
    _same(before, _snapshot(ns))
    _no_fakes(ns)
    fit = ns["_memfit"]
    assert r.result.result is fit
    assert fit.fits is True
    assert fit.peak_line == 5 and fit.peak_source == "loss.backward()"
    assert set(fit.categories) == {"parameters", "gradients", "optimizer_state", "activations", "temporaries", "inputs"}
    assert sum(fit.categories.values()) == fit.peak_bytes
    assert list(fit.modules.columns) == ["module", "category", "bytes"]
    assert "model.4" in set(fit.modules["module"])
    assert any("line 8: .item() answered 1.0" in n for n in fit.notes)
    text = r.result.result._repr_mimebundle_()["text/plain"]
    html = r.result.result._repr_mimebundle_()["text/html"]
    for form in (text, html):
        assert "fits on T4" in form
        assert "CUDA context" in form and "github.com/pytorch/pytorch/pull/86509" in form
        assert "loss.backward()" in form
    assert "<table" in html


def test_the_next_real_run_is_unaffected(ip, run, ns):
    run("%%memfit --memory 8GiB\n" + STEP)
    r = run(STEP)
    assert r.result.success, r.result.error_in_exec
    assert len(ns["losses"]) == 1 and isinstance(ns["losses"][0], float) and ns["losses"][0] != 1.0


def test_cuda_cell_without_a_gpu_does_not_abort_and_is_counted_on_cuda(ip, run, ns):
    if torch.cuda.is_available():
        pytest.skip("the no-GPU path")
    before = _snapshot(ns)
    r = run(
        "%%memfit --gpu A100-80GB\n"
        "model.cuda()\n"
        "x = torch.randn(B, 3, 16, 16, device='cuda')\n"
        "y = torch.randint(0, 10, (B,)).to('cuda', non_blocking=True)\n"
        "loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "loss.backward()\n"
        "optimizer.step()\n"
        "host = loss.detach().cpu()\n"
    )
    assert r.result.success, r.result.error_in_exec
    _same(before, _snapshot(ns))
    fit = ns["_memfit"]
    assert any("No GPU here" in n for n in fit.notes)
    assert fit.categories["parameters"] > 0 and fit.categories["activations"] > 0
    assert next(ns["model"].parameters()).device.type == "cpu"


def test_data_dependent_operations_get_stated_approximations(ip, run, ns):
    r = run(
        "%%memfit --memory 8GiB\n"
        "x = torch.randn(B, 100)\n"
        "if x.sum() > 0:\n"
        "    x = x * 2\n"
        "idx = x.nonzero()\n"
        "sel = x[x > 0]\n"
        "x[x < 0] = 0\n"
        "n = 0\n"
        "while (x > 0).any():\n"
        "    n += 1\n"
        "arr = x.numpy()\n"
    )
    assert r.result.success, r.result.error_in_exec
    notes = " ".join(ns["_memfit"].notes)
    assert "line 3: truth of a tensor answered True" in notes
    assert "line 5: nonzero answered its upper bound (1600 elements)" in notes
    assert "line 6: a boolean mask answered its upper bound" in notes
    assert "line 9: truth of a tensor answered True (3×); truth of a tensor answered False after 3 Trues" in notes
    assert "line 11: .numpy() answered zeros" in notes
    assert "n" not in ns and "idx" not in ns


def test_an_operation_that_needs_values_stops_with_a_message_naming_the_line(ip, run, ns):
    r = run("%%memfit --memory 8GiB\nx = torch.randn(100)\nu = torch.unique(x)\n")
    err = r.result.error_in_exec
    assert type(err).__name__ == "MemfitError"
    assert "line 3: _unique2 needs the tensor's values" in str(err)
    assert "dry run stopped" in r.html()  # the partial report was shown
    assert run("z = 1 + 1").result.success  # the kernel lives


def test_a_torch_cuda_call_without_a_gpu_stops_with_its_line(ip, run, ns):
    if torch.cuda.is_available():
        pytest.skip("the no-GPU path")
    r = run("%%memfit --memory 8GiB\nx = torch.ones(3)\ntorch.cuda.synchronize()\n")
    assert "line 3: AssertionError: Torch not compiled with CUDA enabled" in str(r.result.error_in_exec)
    assert "torch.cuda calls need a GPU" in str(r.result.error_in_exec)


def test_a_statement_that_does_not_compile_stops_before_any_dry_run(ip, run, ns):
    # A plain cell runs the lines before a `return` outside a function, then fails there. A
    # dry run sets no real name either way, so it runs nothing: the plain cell's error, shown
    # as IPython shows it, no report, the namespace as it was (issue 25, item 16).
    import re

    from gpumagic import memfit

    body = "x_ret = 1\nx = model(torch.randn(B, 3, 16, 16))\nreturn x\n"
    ip.user_ns["x_ret"] = 0
    ip.user_ns.pop("_memfit", None)
    r = run(f"%%memfit --memory 8GiB\n{body}")
    error = r.result.error_in_exec
    assert ip.user_ns["x_ret"] == 0 and "x" not in ip.user_ns and "_memfit" not in ip.user_ns
    assert r.outputs == []  # no report: nothing was dry-run
    plain = run(body)
    assert ip.user_ns["x_ret"] == 1  # what the plain cell does
    expected = plain.result.error_before_exec
    assert type(error) is type(expected) is SyntaxError
    assert (error.msg, error.lineno) == (expected.msg, expected.lineno + 1)  # the magic line is 1
    where = re.compile(r"Cell In\[\d+\], line \d+")
    assert where.sub("", r.plain_stdout) == where.sub("", plain.plain_stdout)
    assert "line 4" in r.plain_stdout
    # from a script: the same error, before anything runs, its line counted from 1
    with pytest.raises(SyntaxError, match="'return' outside function") as info:
        memfit(body, {"model": ns["model"], "B": 2, "torch": torch, "x_ret": 0}, memory="8GiB")
    assert info.value.lineno == 3


def test_an_iterator_is_refused_not_advanced(ip, run, ns):
    run("batches = iter([torch.ones(2), torch.ones(3)])")
    r = run("%%memfit --memory 8GiB\nx = next(batches)\n")
    assert "`batches` is an iterator" in str(r.result.error_in_exec)
    assert run("assert next(batches).numel() == 2").result.success


def test_a_runaway_loop_stops_at_the_time_limit(ip, run, ns):
    r = run("%%memfit --memory 8GiB --timeout 0.5\nx = torch.ones(3)\nwhile True:\n    x = x + 1\n")
    assert "took longer than 0.5 s" in str(r.result.error_in_exec)
    assert "line 4" in str(r.result.error_in_exec) or "line 3" in str(r.result.error_in_exec)


def test_prints_are_not_shown_but_counted(ip, run, ns):
    r = run("%%memfit --memory 8GiB\nfor i in range(3):\n    print('step', i)\n")
    assert r.result.success
    assert "step" not in r.stdout
    assert any("it printed 21 characters, not shown" in n for n in ns["_memfit"].notes)


def test_displays_and_figures_of_the_dry_run_stay_off_screen(ip, run, ns):
    import matplotlib.pyplot as plt

    plt.close("all")  # a figure an earlier test left open is another case (issue 25)
    r = run(
        "%%memfit --memory 8GiB\n"
        "from IPython.display import display, HTML\n"
        "display(HTML('<b>dry</b>'))\n"
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2])\n"
    )
    assert r.result.success, r.result.error_in_exec
    assert "<b>dry</b>" not in r.html()
    assert plt.get_fignums() == []
    assert "The dry runs displayed 2 outputs (figures, tables), not shown." in ns["_memfit"].notes


def test_without_a_target_every_card_of_the_table_is_judged(ip, run, ns):
    if torch.cuda.is_available():
        pytest.skip("with a GPU the target is this GPU")
    r = run("%%memfit -q\n" + STEP)
    assert r.result.success and r.result.result is None
    fit = ns["_memfit"]
    assert fit.fits is None and fit.target is None
    names = [v[0] for v in fit.verdicts]
    for card in ("H200", "H100 80GB", "A100 40GB", "A100 80GB", "L4", "A10G", "T4", "V100 16GB", "RTX 4090", "RTX 3090"):
        assert card in names
    assert all(v[2] is True for v in fit.verdicts)


def test_a_cell_needing_more_than_the_card_does_not_fit(ip, run, ns):
    r = run("%%memfit --gpu T4\nbig = torch.empty(2**34, dtype=torch.uint8)\n")  # 16 GiB
    assert r.result.success
    assert ns["_memfit"].fits is False and ns["_memfit"].peak_bytes == 2**34


def test_within_the_headroom_the_verdict_is_none(ip, run, ns):
    # 14.75 GiB less 300 MiB: fits without the headroom's top, not with it
    r = run("%%memfit --gpu T4\nbig = torch.empty(int(14.4 * 2**30), dtype=torch.uint8)\n")
    assert r.result.success
    assert ns["_memfit"].fits is None
    assert "within the headroom's uncertainty" in r.result.result._repr_mimebundle_()["text/plain"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--gpu K80", "no GPU named 'K80' in the table; known: H200"),
        ("--gpu T4 --memory 8GiB", "give --gpu or --memory, not both"),
        ("--memory lots", "size must be like"),
        ("--gpu T4 --batch B", "--batch 'B': give VAR=v1,v2,..."),
        ("--gpu T4 --what-if faster", "unknown fix faster"),
        ("-o 1x", "unrecognized arguments: 1x"),  # -o returns the result: it takes no name
    ],
)
def test_bad_options_are_usage_errors(ip, run, ns, line, message):
    from IPython.core.error import UsageError

    r = run(f"%%memfit {line}\nx = 1\n")
    err = r.result.error_in_exec or r.result.error_before_exec
    assert isinstance(err, UsageError), err
    assert message in str(err)


def test_batch_and_what_ifs_through_the_magic(ip, run, ns):
    r = run("%%memfit --gpu T4 --batch B=8,16,32 --what-if sgd,batch\n" + STEP)
    assert r.result.success, r.result.error_in_exec
    fit = ns["_memfit"]
    assert fit.max_batch is not None and fit.max_batch > 32
    b = fit.batches
    assert list(b.columns) == ["batch", "peak_bytes", "need_bytes", "fits"]
    assert b.loc[b["batch"] == fit.max_batch, "fits"].item()
    assert not b.loc[b["batch"] == fit.max_batch + 1, "fits"].item()
    assert list(fit.what_if["fix"]) == ["sgd", "batch"]
    assert fit.what_if.set_index("fix").loc["batch", "changed"] == "B = 8 (was 16)"
    text = r.result.result._repr_mimebundle_()["text/plain"]
    assert f"largest B that fits: {fit.max_batch:,}" in text
    assert "What each fix would save" in text
