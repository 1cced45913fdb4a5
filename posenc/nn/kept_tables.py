"""Tables a scheme derives from its own parameters and buffers alone (bias rows by distance, FIRE's MLP pieces,
Transformer-XL's projected distances), kept across forwards while those tensors are unchanged.

A decode step asks for the table of the step before, one distance longer: building it again cost most of what a
scheme adds to a step (tens of small operators, or a projection of every distance). Kept over a range that doubles
when outgrown, a step reads a slice. An entry holds values only, built without autograd: callers keep a table only
where no gradient is wanted and build it afresh, with its graph, otherwise. It is built outside inference_mode, so a
training step after an evaluation under inference_mode can save it for backward (posenc.inference_tensors).

A change is seen by the versions of the module's tensors; an inference tensor (a model built under inference_mode) has
none, so a copy of its values kept with the table is compared instead (p.copy_ there changes it in place unseen), and
load_state_dict also drops the module's entries. A write through `p.data` bumps no version: it is not seen.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from posenc.inference_tensors import FIXED, ordinary, tensor_version

_kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> {kind: (state, value)}
_children: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> (_registrations then, modules below it)
_registrations = [0]  # submodules registered anywhere so far: a parametrization or an adapter added after a table
# was kept holds the tensors that change from then on, which a listing of the modules taken before it misses


def _registered(module: nn.Module, name: str, submodule: Any) -> None:
    _registrations[0] += 1


nn.modules.module.register_module_module_registration_hook(_registered)


State = tuple[tuple[Tensor, int, int], ...]


def parameters(module: nn.Module) -> tuple[Tensor, ...]:
    """module.parameters(), read from each module's own dict (its submodules listed once): asked once per step,
    and in every layer for a scheme per layer, where module.parameters()'s generators cost more than what they
    guard."""
    return tuple(t for m in _modules(module) for t in m._parameters.values() if t is not None)


def state(module: nn.Module) -> State:
    """The module's parameters and buffers with their versions and storage: an optimizer step or load_state_dict
    (a new version), .to() (new storage in the same tensor object) or a replaced tensor changes it."""
    return tuple((t, tensor_version(t), t.data_ptr()) for m in _modules(module)
                 for t in itertools.chain(m._parameters.values(), m._buffers.values()) if t is not None)


def _modules(module: nn.Module) -> tuple[nn.Module, ...]:
    listed = _children.get(module)
    if listed is None or listed[0] != _registrations[0]:  # a submodule was registered since: list them again
        listed = _children[module] = (_registrations[0], tuple(module.modules())[1:])  # not module: the key stays weak
    return (module, *listed[1])


def same_state(a: State, b: State) -> bool:
    return len(a) == len(b) and all(s[0] is t[0] and s[1:] == t[1:] for s, t in zip(a, b, strict=True))


def kept(module: nn.Module, kind: Any, fits: Callable[[Any], bool], build: Callable[[], Any]) -> Any:
    """build()'s value, kept for module under kind (a hashable naming the table, its device and dtype) while the
    module's tensors are unchanged and fits(value) says it covers what the caller asks; built without autograd
    and outside inference_mode."""
    entries = _kept.get(module)
    if entries is None:
        entries = _kept[module] = {}
        module.register_load_state_dict_post_hook(_forget)
    now = state(module)
    hit = entries.get(kind)
    if hit is not None and same_state(hit[0], now) and _unchanged(hit[2]) and fits(hit[1]):
        return hit[1]
    value = ordinary(build)  # ordinary tensors: a training step after an evaluation under inference_mode reads them
    entries[kind] = (now, value, ordinary(lambda: _values(now)))
    return value


def _values(now: State) -> tuple[tuple[Tensor, Tensor], ...]:
    """A copy of each inference tensor's values: it has no version to show a change made in place under
    inference_mode (p.copy_(...), an adapter merged into the weights), so the values themselves are compared."""
    return tuple((t, t.clone()) for t, version, _ in now if version == FIXED)


def _unchanged(values: tuple[tuple[Tensor, Tensor], ...]) -> bool:
    return all(torch.equal(t, copy) for t, copy in values)


def _forget(module: nn.Module, incompatible_keys: Any) -> None:
    entries = _kept.get(module)  # None in a copy (deepcopy copies the hook, not the entries)
    if entries is not None:
        entries.clear()  # cleared, not removed: the hook stays registered once


def kept_span(module: nn.Module, kind: Any, low: int, high: int, build: Callable[[int, int], Tensor | None],
              dim: int = -1) -> Tensor | None:
    """build(first, last), a table whose axis dim runs over r = first..last, kept for module under kind over a
    range that covers low..high and doubles when outgrown; returns its slice for low..high (a view)."""
    def covers(value: tuple) -> bool:
        return value[0] <= low and high <= value[1]

    def grown() -> tuple:
        first, last = min(low, 2 * low), max(high, 2 * high)
        return first, last, build(first, last)

    first, _, table = kept(module, kind, covers, grown)
    return None if table is None else table.narrow(dim, low - first, high - low + 1)


def wanted_gradient(module: nn.Module) -> bool:
    """Autograd is on and one of the module's parameters wants a gradient: a kept table would drop it."""
    return torch.is_grad_enabled() and any(p.requires_grad for p in parameters(module))


__all__ = ["kept", "kept_span", "parameters", "same_state", "state", "wanted_gradient"]
