"""``%%memfit --what-if lora:RANK``: what low-rank adapters on a model's linear layers would
need, made in the dry run's shadow as peft makes them (issue 26, item 5).

peft's ``LoraConfig(r=RANK, target_modules="all-linear")`` freezes the base model and gives
each linear layer but the output head (``torch.nn.Linear``, Hugging Face's ``Conv1D``) two
matrices, ``lora_A`` (RANK × in) and ``lora_B`` (out × RANK), added to the layer's output as
``lora_B(lora_A(x)) * alpha / RANK``; the optimizer then holds state for the adapters only.
The same change here, on the shadow's fake parameters: what autograd keeps (the layer's input
for ``lora_A``'s gradient, the RANK-wide intermediate for ``lora_B``'s; no gradient for a
frozen weight) follows from running it. ``lora_dropout`` is peft's default, 0 (none).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gpumagic.memory.fit.answers import Answers, ValueAnswers
from gpumagic.memory.fit.shadow import Shadow
from gpumagic.namespace import is_a, user_items

ALPHA = 16  # peft's default lora_alpha (the scale is alpha / rank; no memory depends on it)


def _in_out(module: nn.Module) -> tuple[int, int] | None:
    """(in, out) features of a linear layer peft adapts, None for anything else."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    weight = getattr(module, "weight", None)
    # Hugging Face's Conv1D (GPT-2): a linear layer whose weight is stored (in, out)
    if type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(weight.shape[0]), int(weight.shape[1])
    return None


def _targets(model: nn.Module) -> list[tuple[str, nn.Module, int, int]]:  # name, layer, in, out
    """The linear layers of ``model`` but its output head (peft's "all-linear")."""
    head = None
    get_head = getattr(model, "get_output_embeddings", None)
    if callable(get_head):
        with contextlib.suppress(Exception):
            head = get_head()
    found = []
    for name, module in model.named_modules():
        shape = _in_out(module)
        if shape is not None and module is not head and not hasattr(module, "lora_A"):
            found.append((name, module, *shape))
    return found


def _adapt(module: nn.Module, rank: int, n_in: int, n_out: int, like: torch.Tensor) -> int:
    """Give ``module`` its two adapters (parameters of it, so a census names them by module)
    and add them to its output; returns how many elements they hold."""
    a = nn.Parameter(torch.zeros(rank, n_in, dtype=like.dtype, device=like.device))
    b = nn.Parameter(torch.zeros(n_out, rank, dtype=like.dtype, device=like.device))
    module.register_parameter("lora_A", a)
    module.register_parameter("lora_B", b)
    plain = module.forward
    scale = ALPHA / rank

    def adapted(x: torch.Tensor, *args: Any, _f: Callable[..., Any] = plain, **kwargs: Any) -> Any:
        out = _f(x, *args, **kwargs)
        lora = nn.functional.linear(nn.functional.linear(x.to(a.dtype), a), b) * scale
        return out + lora.to(out.dtype)

    module.forward = adapted
    return a.numel() + b.numel()


def _weight(module: nn.Module) -> torch.Tensor:
    weight = module.weight
    assert isinstance(weight, torch.Tensor)  # _in_out checked it
    return weight


def _warm(new: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    """One step with zero gradients, in the fake parameters' own mode: the state an optimizer
    in the steady state holds (the old one held state, so the cell runs after a step)."""
    mode = getattr(params[0], "fake_mode", None)
    values = ValueAnswers(Answers(lambda: -1)) if mode is not None else contextlib.nullcontext()
    with mode if mode is not None else contextlib.nullcontext(), values, torch.no_grad():
        for p in params:
            p.grad = torch.zeros_like(p)
        try:
            new.step()
        finally:
            for p in params:
                p.grad = None


def add_lora(shadow: Shadow, rank: int, model_name: str, model: nn.Module) -> list[str]:
    """Freeze ``model`` (the shadow's), give its linear layers adapters of ``rank``, and
    give each optimizer over its parameters the adapters instead; says what it changed."""
    targets = _targets(model)
    first = next(iter(model.parameters()), None)
    if not targets or first is None:
        return []
    frozen = 0
    for p in model.parameters():
        frozen += p.numel()
        p.grad = None
        p.requires_grad_(False)
    mode = getattr(first, "fake_mode", None)
    with mode if mode is not None else contextlib.nullcontext():
        trainable = sum(_adapt(m, rank, n_in, n_out, _weight(m)) for _, m, n_in, n_out in targets)
    adapters: list[torch.Tensor] = [p for _, m, _, _ in targets for n, p in m.named_parameters() if n.startswith("lora_")]
    changed = [
        f"{model_name} frozen ({frozen:,} parameters); LoRA adapters of rank {rank} on its "
        f"{len(targets)} linear layers, the output head left out ({trainable:,} trainable parameters; "
        f"peft's LoraConfig(r={rank}, target_modules='all-linear'))"
    ]
    owned = {id(p) for p in model.parameters()}
    for name, opt in [(n, o) for n, o in user_items(shadow.namespace) if is_a(o, torch.optim.Optimizer)]:
        if not any(id(p) in owned for g in opt.param_groups for p in g["params"]):
            continue
        defaults = {k: v for k, v in opt.defaults.items() if k != "params"}
        try:
            new = type(opt)(adapters, **defaults)
        except TypeError:  # an optimizer whose defaults are not all its arguments
            new = type(opt)(adapters, lr=defaults.get("lr", 1e-3))  # type: ignore[call-arg]
        held = any(opt.state.get(p) for g in opt.param_groups for p in g["params"])
        if held:
            _warm(new, adapters)
        shadow.namespace[name] = new
        state = ", its state as after a step" if held else ""
        changed.append(f"{name}: {type(opt).__name__} over the adapters only{state}")
    return changed
