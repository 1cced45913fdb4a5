"""Peak memory on CPU, where torch has no max_memory_allocated: a TorchDispatchMode sees every tensor
an op returns and tracks the largest one and the peak of live bytes (unique storages still
referenced), i.e. what the allocator must hold at once. Kernel-internal workspaces (e.g. inside
SDPA's flash kernel) are not tensors and are not seen; every path is measured the same way."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class MemoryWatch(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.alive: list[weakref.ref] = []
        self.largest, self.peak = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes())
                self.alive.append(weakref.ref(t))
        storages = {r().untyped_storage().data_ptr(): r().untyped_storage().nbytes()
                    for r in self.alive if r() is not None}
        self.peak = max(self.peak, sum(storages.values()))
        return out


def peak_live_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes of tensors created by fn() and alive at once (inputs excluded)."""
    with torch.no_grad(), MemoryWatch() as watch:
        fn()
    return watch.peak
