"""The fixes ``%%memfit --what-if`` tries, each as a change to the dry run's shadow namespace
(or to how the cell runs), never as a rule of thumb: the saving is the difference between
two dry runs.

* ``amp``: mixed precision, the cell under ``torch.autocast`` (float16);
* ``checkpoint``: activation checkpointing per repeated block, as people checkpoint
  transformers: a model's own ``gradient_checkpointing_enable()`` where it has one (Hugging
  Face's), else each layer of its largest stack of repeated blocks (a ``ModuleList`` or
  ``Sequential`` of two or more blocks of one class: ``transformer.h``, ``encoder.layer``),
  else its top-level blocks (``torch.utils.checkpoint``, ``use_reentrant=False``). Checkpointing
  a model's whole body as one segment saves next to nothing (issue 26, item 3);
* ``sgd``: the optimizer replaced by SGD with momentum (one state tensor per parameter
  instead of Adam's two);
* ``adafactor``: the optimizer replaced by ``torch.optim.Adafactor`` (factored second
  moments; torch >= 2.5);
* ``set_to_none``: ``zero_grad(set_to_none=True)`` wherever the cell zeroes gradients;
* ``batch``: half the batch (``--batch VAR``'s value, or a batch-size variable the cell
  reads: ``batch_size``, ``BATCH_SIZE``, ``bs``, ``batch``, ``B``);
* ``lora:RANK`` (not in ``all``): the model frozen, low-rank adapters of that rank on its
  linear layers, the optimizer over the adapters only (:mod:`.adapters`).

Each change is made to the shadow only; what it changed is said in words for the report.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gpumagic.memory.fit.answers import Answers, ValueAnswers
from gpumagic.memory.fit.shadow import Shadow
from gpumagic.memory.fit.suggest import batch_variable
from gpumagic.namespace import instance_dict, is_a, user_items

FIXES = ("amp", "checkpoint", "sgd", "adafactor", "set_to_none", "batch")


@dataclass
class Fix:
    """A what-if: how to run the cell differently. ``transform`` changes the shadow and says
    what it changed ([] when there was nothing to change); ``autocast`` and ``overrides`` go
    to :func:`~.dry_run.dry_run`; ``unavailable``: why it cannot be tried."""

    name: str
    transform: Callable[[Shadow], list[str]] | None = None
    autocast: torch.dtype | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    changed: str = ""
    unavailable: str = ""


def _lora_rank(name: str) -> int | None:
    """RANK of ``lora:RANK``; None when ``name`` is not one (a bad rank raises)."""
    if not name.startswith("lora"):
        return None
    rank = name[len("lora") :].lstrip(":=")
    if not rank.isdigit() or int(rank) < 1:
        raise ValueError(f"{name}: give the adapters' rank as lora:RANK, a whole number from 1 (lora:8)")
    return int(rank)


def parse_fixes(text: str) -> list[str]:
    names = [n.strip().lower().replace("-", "_") for n in text.split(",") if n.strip()]
    lora = [n for n in names if _lora_rank(n) is not None]
    if "all" in names:
        return list(dict.fromkeys([*FIXES, *lora]))
    unknown = [n for n in names if n not in FIXES and n not in lora]
    if unknown:
        raise ValueError(f"unknown fix {', '.join(unknown)}: choose from {', '.join(FIXES)}, lora:RANK or all")
    return list(dict.fromkeys(names))


def make_fix(name: str, batch: tuple[str, int] | None, names_read: set[str], namespace: Mapping[str, Any]) -> Fix:
    """The fix ``name``; ``batch``: the batch variable and its value in the run compared
    against; ``names_read``: the names the cell reads (a batch-size variable is found there)."""
    if name == "amp":
        return Fix(name, autocast=torch.float16, changed="the cell under torch.autocast(dtype=float16)")
    if name == "checkpoint":
        return Fix(name, transform=checkpoint_blocks)
    rank = _lora_rank(name)
    if rank is not None:
        return Fix(name, transform=functools.partial(lora_adapters, rank=rank))
    if name in ("sgd", "adafactor"):
        if name == "adafactor" and not hasattr(torch.optim, "Adafactor"):
            return Fix(name, unavailable="torch.optim.Adafactor needs torch >= 2.5")
        return Fix(name, transform=functools.partial(swap_optimizers, kind=name))
    if name == "set_to_none":
        if "zero_grad" not in names_read:
            return Fix(name, unavailable="the cell calls no zero_grad()")
        return Fix(name, transform=zero_grad_to_none)
    if name == "batch":
        if batch is None:
            batch = batch_variable(names_read, namespace)
            if batch is None:
                return Fix(name, unavailable="give --batch VAR=... (no batch-size variable found in the cell)")
        var, value = batch
        half = max(1, value // 2)
        return Fix(name, overrides={var: half}, changed=f"{var} = {half} (was {value})")
    raise ValueError(f"unknown fix {name!r}")


# -- the shadow's models and optimizers --------------------------------------------------------


def _top_models(shadow: Shadow) -> list[tuple[str, nn.Module]]:
    """The namespace's models, largest first, none that is part of another."""
    models = [(n, m) for n, m in user_items(shadow.namespace) if is_a(m, nn.Module)]
    inner = {id(sub) for _, m in models for sub in list(m.modules())[1:]}
    models = [(n, m) for n, m in models if id(m) not in inner]
    return sorted(models, key=lambda nm: -sum(p.numel() for p in nm[1].parameters()))


def _blocks(model: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
    """The model's top-level blocks: its children, a container child (``layers``,
    ``layer1``) opened one level, keeping those with parameters."""
    found: list[tuple[str, nn.Module]] = []
    for name, child in model.named_children():
        opened = isinstance(child, (nn.Sequential, nn.ModuleList)) and sum(
            1 for c in child.children() if any(True for _ in c.parameters())
        ) >= 2
        items = [(f"{name}.{n}", c) for n, c in child.named_children()] if opened else [(name, child)]
        found += [(f"{prefix}.{n}", c) for n, c in items if any(True for _ in c.parameters())]
    return found


def _repeated_blocks(model: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
    """The layers of the model's largest stack of repeated blocks (by parameters): a
    ``ModuleList``/``Sequential`` of two or more blocks of one class, each with parameters
    and children of its own (a stack of single layers is left to ``checkpoint_sequential``)."""
    best: list[tuple[str, nn.Module]] = []
    best_size = 0
    for name, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(module.named_children())
        kinds = {type(c) for _, c in children}
        if len(children) < 2 or len(kinds) != 1:
            continue
        if any(next(iter(c.children()), None) is None or next(iter(c.parameters()), None) is None for _, c in children):
            continue
        size = sum(p.numel() for p in module.parameters())
        if size > best_size:
            best = [(f"{prefix}.{name}.{n}" if name else f"{prefix}.{n}", c) for n, c in children]
            best_size = size
    return best


def _own_checkpointing(model: nn.Module, name: str) -> list[str]:
    """A model's own per-layer checkpointing (Hugging Face's ``supports_gradient_checkpointing``
    models), turned on with ``use_reentrant=False`` as torch recommends; [] when it has none."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        return []
    # transformers 5 names it activation_checkpointing_enable (the old name warns), with its
    # keyword renamed to match
    for method, keyword in (
        ("activation_checkpointing_enable", "activation_checkpointing_kwargs"),
        ("gradient_checkpointing_enable", "gradient_checkpointing_kwargs"),
    ):
        enable = getattr(model, method, None)
        if enable is None:
            continue
        try:
            enable(**{keyword: {"use_reentrant": False}})
        except (TypeError, ValueError, AttributeError):
            continue
        break
    else:
        return []
    return [f"{name}.{method}(use_reentrant=False): its own checkpointing, per layer"]


def _checkpoint_each(blocks: list[tuple[str, nn.Module]]) -> str:
    from torch.utils.checkpoint import checkpoint

    for _, block in blocks:
        inner = block.forward

        def wrapped(*args: Any, _f: Callable[..., Any] = inner, **kwargs: Any) -> Any:
            return checkpoint(_f, *args, use_reentrant=False, **kwargs)

        block.forward = wrapped
    shown = ", ".join(n for n, _ in blocks[:6]) + (f" and {len(blocks) - 6} more" if len(blocks) > 6 else "")
    return f"checkpointed {shown} (torch.utils.checkpoint, use_reentrant=False)"


def checkpoint_blocks(shadow: Shadow) -> list[str]:
    from torch.utils.checkpoint import checkpoint_sequential

    changed: list[str] = []
    for name, model in _top_models(shadow)[:1]:
        own = _own_checkpointing(model, name)
        if own:
            changed += own
            continue
        repeated = _repeated_blocks(model, name)
        if repeated:
            changed.append(_checkpoint_each(repeated) + ", one per repeated block")
            continue
        leaves = all(next(iter(c.children()), None) is None for c in model.children())
        if isinstance(model, nn.Sequential) and leaves:
            # A Sequential of single layers: checkpointing each layer keeps each input anyway;
            # segments of it are what torch.utils.checkpoint_sequential is for.
            segments = max(2, round(math.sqrt(len(model))))

            def sequential(x: Any, _m: nn.Module = model, _s: int = segments) -> Any:
                return checkpoint_sequential(_m, _s, x, use_reentrant=False)

            model.forward = sequential  # type: ignore[method-assign]
            changed.append(f"{name} run as {segments} checkpointed segments (checkpoint_sequential)")
            continue
        blocks = _blocks(model, name)
        if blocks:
            changed.append(_checkpoint_each(blocks))
    return changed


def lora_adapters(shadow: Shadow, rank: int) -> list[str]:
    from gpumagic.memory.fit.adapters import add_lora

    return [c for name, model in _top_models(shadow)[:1] for c in add_lora(shadow, rank, name, model)]


def _optimizers(shadow: Shadow) -> list[tuple[str, torch.optim.Optimizer]]:
    return [(n, o) for n, o in user_items(shadow.namespace) if is_a(o, torch.optim.Optimizer)]


def swap_optimizers(shadow: Shadow, kind: str) -> list[str]:
    changed: list[str] = []
    swapped: dict[int, torch.optim.Optimizer] = {}
    for name, opt in _optimizers(shadow):
        groups = [{"params": g["params"], "lr": g.get("lr", 1e-3)} for g in opt.param_groups]
        new: torch.optim.Optimizer
        if kind == "sgd":
            new = torch.optim.SGD(groups, lr=groups[0]["lr"], momentum=0.9)
            what = "SGD(momentum=0.9)"
        else:
            new = torch.optim.Adafactor(groups, lr=groups[0]["lr"])
            what = "Adafactor"
        swapped[id(opt)] = new
        shadow.namespace[name] = new
        warmed = _warm_like(new, opt)
        state = (
            f"its state as after a step for the {warmed} parameters the old one held state for"
            if warmed
            else "no state yet (the old one held none)"
        )
        changed.append(f"{name}: {type(opt).__name__} replaced by {what}, {state}")
    if swapped:  # objects that hold the optimizer (a trainer, a scheduler) get the new one
        for _, value in user_items(shadow.namespace):
            attrs = instance_dict(value)
            if attrs is not None and not is_a(value, (nn.Module, torch.optim.Optimizer)):
                for key, held in list(attrs.items()):
                    if id(held) in swapped:
                        attrs[key] = swapped[id(held)]
    return changed


def _warm_like(new: torch.optim.Optimizer, old: torch.optim.Optimizer) -> int:
    """Give ``new`` the state it would hold in the steady state ``old`` is in: one step with
    zero gradients on the parameters ``old`` holds state for (the shadow's fake parameters,
    so nothing real moves). Without it a swap in the middle of training would compare Adam's
    standing state with an SGD that has not made its momentum yet, and overstate the saving
    by the whole of Adam's state. Returns how many parameters were warmed."""
    held = [p for g in old.param_groups for p in g["params"] if old.state.get(p)]
    if not held:
        return 0
    ids = {id(p) for p in held}
    saved = {}
    # the shadow's parameters are fake: their ops run in their own fake mode
    # (Adafactor reads its step count with .item(): answered as in the dry run itself)
    mode = getattr(held[0], "fake_mode", None)
    values = ValueAnswers(Answers(lambda: -1)) if mode is not None else contextlib.nullcontext()
    with mode if mode is not None else contextlib.nullcontext(), values, torch.no_grad():
        for g in new.param_groups:
            for p in g["params"]:
                saved[id(p)] = (p, p.grad)
                p.grad = torch.zeros_like(p) if id(p) in ids else None
        try:
            new.step()
        finally:
            for p, grad in saved.values():
                p.grad = grad
    return len(held)


def zero_grad_to_none(shadow: Shadow) -> list[str]:
    changed: list[str] = []
    for name, obj in user_items(shadow.namespace):
        if is_a(obj, (torch.optim.Optimizer, nn.Module)):
            plain = obj.zero_grad

            def to_none(*args: Any, _f: Callable[..., Any] = plain, **kwargs: Any) -> Any:
                return _f(set_to_none=True)  # zero_grad's one argument, however it was given

            obj.zero_grad = to_none
            changed.append(f"{name}.zero_grad(set_to_none=True)")
    return changed
