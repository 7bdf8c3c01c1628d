"""Generation in a dry run: Hugging Face's ``generate`` runs to its length limit.

A ``generate`` loop stops when every sequence is done, by its length limit
(``MaxLengthCriteria``: ``max_length``, ``max_new_tokens``) or by what it generated: an
end-of-sequence token (``EosTokenCriteria``), a stop string, a confidence, a time limit. The
first is known in a dry run (shapes are exact, and :mod:`.values` keeps the values of the
tensors the loop's stopping test builds from them); the others depend on tokens a fake model
never produces. The memory a generation needs grows with each step (its key/value cache,
the ids), so the honest prediction is the worst case: **no sequence stops early**. While a
dry run lasts, ``transformers.generation.StoppingCriteriaList`` asks only its length limits;
the criteria it leaves out are named in the report.

Only a ``transformers`` already imported when the dry run starts is changed (a dry run
imports nothing for the cell); the class is put back when it ends.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

_MODULE = "transformers.generation.stopping_criteria"


class Generation:
    """What the dry run's generations assumed: the criteria left out, by class name."""

    def __init__(self) -> None:
        self.left_out: set[str] = set()
        self.calls = 0

    def notes(self) -> list[str]:
        if not self.left_out:
            return []
        return [
            "Generation ran to its length limit (max_new_tokens / max_length): no sequence stops early, "
            "the most memory it can take; the dry run's tokens are placeholders, so "
            f"{', '.join(sorted(self.left_out))} (end-of-sequence, stop strings) were not asked."
        ]


@contextlib.contextmanager
def to_length_limit(said: Generation) -> Iterator[None]:
    """While the block lasts, Hugging Face's stopping criteria stop only at the length
    limit (see the module docstring)."""
    module = sys.modules.get(_MODULE)
    criteria_list = getattr(module, "StoppingCriteriaList", None)
    max_length = getattr(module, "MaxLengthCriteria", None)
    if criteria_list is None or max_length is None:
        yield
        return
    original = criteria_list.__call__

    def length_only(self: Any, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        said.calls += 1
        is_done = torch.full((input_ids.shape[0],), False, device=input_ids.device, dtype=torch.bool)
        for criteria in self:
            if isinstance(criteria, max_length):
                is_done = is_done | criteria(input_ids, scores, **kwargs)
            else:
                said.left_out.add(type(criteria).__name__)
        return is_done

    criteria_list.__call__ = length_only
    try:
        yield
    finally:
        criteria_list.__call__ = original
