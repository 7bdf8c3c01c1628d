"""The values a dry run does know: small tensors whose values follow from the cell's code
alone, not from data it lacks.

A fake tensor has no values (:mod:`.answers`), but many small tensors a program asks
questions of never depended on data: ``torch.ones(batch)``, ``torch.full((b,), done)``,
``torch.arange(n)``, a mask built from a sequence length, what is computed from those. A
``generate`` loop ends on exactly such a question: Hugging Face's ``MaxLengthCriteria``
returns ``torch.full((batch,), cur_len >= max_length)``, the loop ANDs it into
``unfinished_sequences = torch.ones(batch)`` and stops on ``unfinished_sequences.max() == 0``.
``FakeTensorMode`` keeps values only for one-element tensors converted from real ones
(``CONSTANT_NUMEL_LIMIT = 1`` in torch 2.13's ``fake_tensor.py``), so that question came
back unanswerable and the loop never ended (issue 26, item 1).

:class:`KnownValues` keeps, beside each such fake tensor, a real CPU tensor holding its
values: an operation whose inputs all have known values (or are real tensors, or fake
constants), which is deterministic, and whose outputs are small (:data:`LIMIT` elements
each) is run once more on those real tensors, outside every mode, and its outputs are
known. Views are computed on the real tensors too, so a real view shares its base's real
storage as the fake one does, and an in-place operation on a base reaches its views. A
write whose inputs are not all known makes the written storage unknown. Random operations
(``torch.Tag.nondeterministic_seeded``) and uninitialised memory (``empty``) are never known.
What is known is answered exactly (:class:`.answers.ValueAnswers`); the rest keeps its
stated approximation.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._mode_utils import no_dispatch
from torch.utils._pytree import tree_flatten, tree_map_only

from gpumagic.memory.census.reach import tensors_in

# Elements per tensor: values of a size a program branches on (masks over a batch and a
# sequence), and a real copy that costs at most a few MiB.
LIMIT = 1 << 18
# Operations whose output is uninitialised memory: its values are not known whatever its inputs.
_UNINITIALISED = frozenset(
    ("empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted", "resize_", "set_")
)
_RANDOM = torch.Tag.nondeterministic_seeded


def _storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


class _Op:
    """What :class:`KnownValues` needs to know of an operation, from its schema, once."""

    __slots__ = ("kwarg_writes", "never_known", "positional_writes", "writes")

    def __init__(self, func: Any) -> None:
        schema = func._schema
        name = schema.name.split("::")[-1]
        self.never_known = name in _UNINITIALISED or _RANDOM in func.tags
        writes = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        self.positional_writes = tuple(i for i, a in enumerate(schema.arguments) if a in writes and not a.kwarg_only)
        self.kwarg_writes = tuple(a.name for a in writes)
        self.writes = bool(writes)


class KnownValues:
    """The real values of the small fake tensors whose values are known (see the module
    docstring), by the fake tensor's identity; a real tensor's values are itself."""

    def __init__(self, is_fake: type[torch.Tensor]) -> None:
        self.is_fake = is_fake
        self._real: dict[int, tuple[weakref.ref[Any], torch.Tensor, int]] = {}
        self._ops: dict[int, _Op] = {}

    def __len__(self) -> int:
        return len(self._real)

    # -- reading -------------------------------------------------------------------------------
    def value(self, t: Any) -> torch.Tensor | None:
        """``t``'s values as a real CPU tensor, or None when they are not known."""
        if not isinstance(t, self.is_fake):
            # a real tensor the cell reached (torch.tensor()'s data, a namespace's tensor)
            return t if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.numel() <= LIMIT else None
        constant = getattr(t, "constant", None)
        if constant is not None:
            return constant  # FakeTensorMode's own (one element)
        found = self._real.get(id(t))
        if found is None or found[0]() is not t:
            return None
        return found[1]

    # -- after each operation ------------------------------------------------------------------
    def after(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """``func(*args, **kwargs)`` returned ``out`` (fake): keep the values of its outputs
        when they are known, forget those of storages it wrote when they are not. Called for
        every operation of a dry run: the common case (a large output) returns at once."""
        op = self._ops.get(id(func))
        if op is None:
            op = self._ops[id(func)] = _Op(func)
        fake = self.is_fake
        kind = type(out)
        if kind is fake:
            small = out.numel() <= LIMIT
        elif kind is tuple or kind is list:
            outs = [t for t in out if isinstance(t, fake)]
            small = bool(outs) and all(t.numel() <= LIMIT for t in outs)
        else:
            small = False
        written = self._written(op, args, kwargs) if op.writes else []
        if not small or op.never_known:
            self._forget(written)
            return
        if any(getattr(w, "constant", None) is not None for w in written):
            return  # FakeTensorMode runs writes into its own constants itself
        if any(not isinstance(w, fake) for w in written) or any(
            self.value(t) is None for t in tensors_in((args, kwargs))
        ):
            self._forget(written)
            return
        real = self._run(func, args, kwargs)
        if real is None:
            self._forget(written)
            return
        self._keep(out, real, written)

    def _written(self, op: _Op, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        written = [args[i] for i in op.positional_writes if i < len(args)]
        written += [kwargs[k] for k in op.kwarg_writes if k in kwargs]
        return [w for w in written if isinstance(w, torch.Tensor)]

    def _run(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        def real(t: torch.Tensor) -> torch.Tensor:
            v = self.value(t)
            assert v is not None
            return v

        def on_cpu(x: Any) -> Any:
            return torch.device("cpu") if isinstance(x, torch.device) else x

        real_args, real_kwargs = tree_map_only(torch.Tensor, real, (args, kwargs))
        if "device" in real_kwargs:
            real_kwargs["device"] = "cpu"  # the values live on the CPU, whatever the fake's device
        real_kwargs.pop("pin_memory", None)
        real_args = tuple(on_cpu(a) for a in real_args)
        try:
            with no_dispatch():
                return func(*real_args, **real_kwargs)
        except Exception:  # an operation the CPU cannot run as called: its values stay unknown
            return None

    def _keep(self, out: Any, real: Any, written: list[Any]) -> None:
        fakes, _ = tree_flatten(out)
        reals, _ = tree_flatten(real)
        if len(fakes) != len(reals):
            self._forget(written)
            return
        for fake, value in zip(fakes, reals):
            if not isinstance(fake, self.is_fake):
                continue
            if not isinstance(value, torch.Tensor) or value.shape != fake.shape or value.dtype != fake.dtype:
                self._forget([fake])
                continue
            if any(w is fake for w in written):
                self._forget_others(fake, value)
            self._real[id(fake)] = (weakref.ref(fake, self._drop(id(fake))), value, _storage_key(fake))

    def _drop(self, ident: int) -> Any:
        table = self._real

        def forget(ref: Any) -> None:
            found = table.get(ident)
            if found is not None and found[0] is ref:
                del table[ident]

        return forget

    def _forget(self, written: list[Any]) -> None:
        """The storages of ``written`` now hold values nobody knows."""
        if not written or not self._real:
            return
        keys = {_storage_key(w) for w in written if isinstance(w, self.is_fake)}
        for ident in [i for i, (_, _, key) in self._real.items() if key in keys]:
            del self._real[ident]

    def _forget_others(self, fake: Any, value: torch.Tensor) -> None:
        """``fake`` was written with known values: tensors of its storage whose real values
        are not views of the same real storage no longer agree with it."""
        key, real_key = _storage_key(fake), _storage_key(value)
        for ident in [
            i for i, (_, v, k) in self._real.items() if k == key and i != id(fake) and _storage_key(v) != real_key
        ]:
            del self._real[ident]
