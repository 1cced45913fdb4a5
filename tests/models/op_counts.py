"""What one call makes the host do, counted by the dispatcher (not timed): operators, the kernels a GPU would
launch for them, the allocations, the host reads (tests/models/host_syncs.py's rule). Triton launches are counted by
whoever stands in for them (the caller adds them with `launched`). Used by the decode step's count tests
(tests/position_maps/test_decode_step_ops.py) and benchmarks/map_decode_ops.py.

On the CPU the same operators run as on a GPU for one code path, so a count taken here is a GPU's, up to the few
operators a device implements differently (SDPA's kernel names)."""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils import _pytree

from tests.models.host_syncs import _HostSyncs, is_sync

COLUMNS = ("aten", "launches", "triton", "allocs", "syncs")
# operators that allocate or read but compute nothing: no kernel launch
NO_LAUNCH = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "_local_scalar_dense",
                       "equal", "lift_fresh", "detach", "alias", "set_"})


class OpCount(_HostSyncs):
    """Inside it, every aten operator: `columns` counts aten (all), launches (those that compute: not views, not
    bare allocations), allocs (those returning new storage), syncs (host reads, Tensor.tolist included), triton
    (added by `launched`); `where` counts operator names; `allocated` counts (operator, shape) of each allocation
    (two steps whose allocations depend on nothing but fixed sizes allocate the same)."""

    def __init__(self) -> None:
        super().__init__()
        self.columns: Counter[str] = Counter()
        self.where: Counter[str] = Counter()
        self.allocated: Counter[tuple[str, tuple[int, ...]]] = Counter()

    def sync(self, what: str) -> None:
        self.columns["syncs"] += 1
        self.where[f"SYNC {what}"] += 1

    def launched(self, kernel: str) -> None:
        """A Triton launch (the caller's stand-in for Triton's launcher calls this)."""
        self.columns["triton"] += 1
        self.columns["launches"] += 1
        self.where[f"triton {kernel}"] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.name().removeprefix("aten::")
        self.columns["aten"] += 1
        self.where[name] += 1
        if is_sync(func, args):
            self.sync(f"aten.{name}")
        alias = func._schema.returns[0].alias_info if func._schema.returns else None
        if alias is None and any(isinstance(t, torch.Tensor) for t in _pytree.tree_leaves(out)):
            self.columns["allocs"] += 1
            for t in _pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.allocated[(name, tuple(t.shape))] += 1
        if (alias is None or alias.is_write) and name.split(".")[0] not in NO_LAUNCH:
            self.columns["launches"] += 1
        return out


__all__ = ["COLUMNS", "OpCount"]
