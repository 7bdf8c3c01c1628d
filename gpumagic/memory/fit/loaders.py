"""A ``DataLoader`` iterated in a dry run loads its batches in the kernel's process.

With ``num_workers=2`` the loader's iterator forks two worker processes, and they outlive the
dry run until a garbage collection reaches the iterator (issue 25, item 6); the workers
would also run the dataset's code on a copy of a process in the middle of a fake-tensor
dispatch. While the dry run runs, a loader with workers hands out torch's single-process
iterator instead: the same batches of the same sizes, made in the kernel (a dry run's
memory is the GPU's, and workers hold host memory anyway). ``worker_init_fn`` does not run
and ``get_worker_info()`` is None in the dataset: the report says so. A persistent loader's
workers, if the user's loader already has them, are neither used nor reset.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["in_process_loaders"]


@contextmanager
def in_process_loaders(made: list[int]) -> Iterator[None]:
    """While the block runs, ``iter()`` of a ``DataLoader`` with workers gives an iterator
    without them; ``made`` gets the worker count of each such loader."""
    from torch.utils.data import dataloader

    cls = dataloader.DataLoader
    original = cls.__iter__

    def in_process(self: Any) -> Any:
        workers = self.num_workers
        if workers <= 0:
            return original(self)
        made.append(workers)
        # torch's single-process iterator asserts no workers and no timeout: the loader
        # reads as such while it is built, and is put back at once (it may be the user's own).
        timeout = self.timeout
        self.num_workers, self.timeout = 0, 0
        try:
            return dataloader._SingleProcessDataLoaderIter(self)
        finally:
            self.num_workers, self.timeout = workers, timeout

    cls.__iter__ = in_process  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.__iter__ = original  # type: ignore[method-assign]
