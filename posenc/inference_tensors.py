"""What torch.inference_mode changes for the memos and kept tables keyed on tensors.

Positions are remembered across the layers of a forward (memos keyed on the positions tensor) and tables across
forwards while a scheme's parameters are unchanged (posenc.nn.kept_tables); either is stale once its tensor was
changed in place, which `t._version` counts. A tensor made under inference_mode (the positions of a forward run
there; the parameters of a model built or moved there) has no version counter: reading it raises. And a tensor
made there is an inference tensor, which autograd refuses to save: a table kept across forwards must not be one, or
the training step after an evaluation under inference_mode fails.

- Positions: an inference tensor that posenc made for one call (`made_for_one_call`, where an entry point frames
  the positions: a fresh tensor each call) is never changed in place, so its identity is its version. Any other
  (a user's, which a decode loop may advance in place: `input_pos += 1`) gets a version that no memo matches.
- Parameters and buffers: an inference tensor changes in place only inside inference_mode (no optimizer can step
  it; a load_state_dict or p.copy_ run there can): it gets one fixed version, or every decode step of a model built
  under inference_mode would build its tables again, and kept_tables compares a copy of its values instead.
- Kept tables are built as ordinary tensors (`ordinary`), whatever mode the call that builds them runs in.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

FIXED = -1  # the version of an inference tensor that cannot change unseen (counted versions start at 0)
_one_call: WeakIdKeyDictionary = WeakIdKeyDictionary()  # inference tensors posenc made for one call -> True
Value = TypeVar("Value")


def made_for_one_call(*positions: Tensor) -> None:
    """Positions an entry point made for this call alone: memos may key on their identity (inference tensors)."""
    if torch.compiler.is_compiling():  # traced: no memo outlives the call, and is_inference() breaks the graph
        return
    for pos in positions:
        if pos.is_inference():
            _one_call[pos] = True


def position_version(pos: Tensor) -> object:
    """pos._version; for an inference tensor FIXED if posenc made it for one call, else a new object (no memo hit)."""
    if not pos.is_inference():
        return pos._version
    return FIXED if pos in _one_call else object()


def tensor_version(t: Tensor) -> int:
    """t._version of a parameter or buffer; FIXED for an inference tensor (see the module docstring)."""
    return FIXED if t.is_inference() else t._version


def ordinary(build: Callable[[], Value]) -> Value:
    """build() without autograd and as ordinary tensors, also under inference_mode: a table kept across calls that
    a training step may read later. (inference_mode(False) turns grad mode on: no_grad comes inside it.)"""
    with torch.inference_mode(False), torch.no_grad():
        return build()


__all__ = ["FIXED", "DerivedPerTensor", "LastPositions", "made_for_one_call", "ordinary", "position_version",
           "tensor_version"]


class LastPositions:
    """fn(*positions) for the last positions tensors asked, kept while they are the same tensors, unchanged: every
    layer (and scheme) of a forward receives the same positions, and what fn reads from them (on a GPU, a host read
    that waits for the device) is read once per forward, not once per layer. A tensor changed in place since has
    another version; an inference tensor not made by posenc for one call never hits (position_version)."""

    def __init__(self, fn: Callable[..., Value]) -> None:
        self.fn, self.last = fn, None

    def __call__(self, *positions: Tensor) -> Value:
        if torch.compiler.is_compiling():  # traced: no memo across calls (identity and versions are not traced);
            return self.fn(*positions)  # fn's operators run in the graph, or break it where fn reads the host
        versions = tuple(position_version(p) for p in positions)
        hit = self.last
        if hit is not None and hit[1] == versions and all(a is b for a, b in zip(hit[0], positions, strict=True)):
            return hit[2]
        value = self.fn(*positions)
        self.last = (positions, versions, value)
        return value



class DerivedPerTensor:
    """fn(tensor, *args) kept while the same tensor lives unchanged: what a kernel derives from a table that every
    layer of a forward shares (rows padded for unmasked reads, row offsets per batch row) is made once per forward,
    not per layer (on a GPU, a launch each). A hit needs the very tensor (a weak reference, so a dead tensor's id
    reused never hits and a kept value never outlives its tensor) and its version (position_version: an inference
    tensor not made for one call never hits). At most `size` entries: the oldest half is dropped past it. fn must
    not record autograd (its value is shared by calls that may backpropagate separately), and its value must not
    hold the tensor (the entry would keep it alive)."""

    def __init__(self, fn: Callable[..., Value], size: int = 8) -> None:
        self.fn, self.size, self.kept = fn, size, {}

    def __call__(self, tensor: Tensor, *args) -> Value:
        key = (id(tensor), *args)
        version = position_version(tensor)
        hit = self.kept.get(key)
        if hit is not None and hit[1] == version and hit[0]() is tensor:
            return hit[2]
        value = self.fn(tensor, *args)
        if len(self.kept) >= self.size:
            for old in list(self.kept)[: self.size // 2]:
                del self.kept[old]
        # the callback drops the entry (and its value) as soon as the tensor dies
        self.kept[key] = (weakref.ref(tensor, lambda _, kept=self.kept, key=key: kept.pop(key, None)), version, value)
        return value
