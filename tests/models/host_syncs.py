"""Host syncs seen from the dispatcher: the operators that make the host wait for the device (a value read back by
.item(), int(), bool(), .tolist(); an output shape that depends on values). `NoHostSync` fails on the first one (the
static decode step's captured part), `HostSyncCount` records every one with the line of posenc that asked for it
(the ordinary decode step's count, tests/models/test_decode_syncs.py and benchmarks/decode_syncs.py).

On the CPU nothing waits, but the same operators run: a count taken here is the count a GPU would wait on."""

from __future__ import annotations

import traceback
from collections import Counter

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

# what .item(), int(), bool() of a tensor call, and the operators whose output shape depends on values
SYNCING = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "unique_consecutive",
           "unique_dim", "repeat_interleave.Tensor", "bincount", "item",
           "equal")  # torch.equal: a bool read back (on CUDA through .item(), on the CPU computed on the host)


def is_sync(func, args: tuple = ()) -> bool:
    """func syncs: it reads a value to the host or its output shape depends on values (x[mask] reaches the
    dispatcher as aten.index with a boolean index, its nonzero inside the kernel)."""
    name = func.name().removeprefix("aten::")
    if name in SYNCING or name.split(".")[0] in SYNCING:
        return True
    return name.startswith("index.") and len(args) > 1 and any(
        isinstance(i, Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1])


class HostSyncError(AssertionError):
    pass


def _caller() -> str:
    """file:line of the innermost posenc frame on the stack (where the read was asked for)."""
    for frame in reversed(traceback.extract_stack()):
        if "/posenc/" in frame.filename and "/tests/" not in frame.filename:
            return f"{frame.filename.rsplit('/posenc/', 1)[1]}:{frame.lineno} {frame.name}"
    return "outside posenc"


class _HostSyncs(TorchDispatchMode):
    """Calls self.sync(what) at every sync inside it. Tensor.tolist and Tensor.numpy copy to the host without an
    operator the dispatcher sees on a CPU tensor: the two methods are wrapped while the mode is on."""

    HOST_COPIES = ("tolist", "numpy")

    def sync(self, what: str) -> None:
        raise NotImplementedError

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if is_sync(func, args):
            self.sync(f"aten.{func.name().removeprefix('aten::')}")
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._methods = {name: torch.Tensor.__dict__.get(name) for name in self.HOST_COPIES}  # None: inherited
        for name in self.HOST_COPIES:
            setattr(torch.Tensor, name, self._wrapped(name, getattr(torch.Tensor, name)))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, method in self._methods.items():
            if method is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, method)
        return super().__exit__(*exc)

    def _wrapped(self, name: str, method):
        def wrapped(tensor, *args, **kwargs):
            self.sync(f"Tensor.{name}")
            return method(tensor, *args, **kwargs)
        return wrapped


class NoHostSync(_HostSyncs):
    """Raises on what a CUDA graph cannot capture: a read of a value by the host or a data-dependent shape."""

    def sync(self, what: str) -> None:
        raise HostSyncError(f"host sync: {what} at {_caller()}")


class HostSyncCount(_HostSyncs):
    """Counts the syncs inside it: `total`, and `where` (Counter of 'what at file:line')."""

    def __init__(self) -> None:
        super().__init__()
        self.where: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.where.values())

    def sync(self, what: str) -> None:
        self.where[f"{what} at {_caller()}"] += 1


def generate_syncs(model, prompt: Tensor, new_tokens: int) -> tuple[list[Counter[str]], Counter[str]]:
    """model.generate(prompt (B,T), new_tokens), greedy and cached, with its syncs counted: (one Counter per call of
    the model's forward: the prompt's, then each decode step's; the Counter of generate's own, outside them)."""
    count, calls, at_start = HostSyncCount(), [], []

    def before(module, args):
        at_start.append(Counter(count.where))

    def after(module, args, output):
        calls.append(count.where - at_start.pop())

    hooks = model.register_forward_pre_hook(before), model.register_forward_hook(after)
    try:
        with count:
            model.generate(prompt, new_tokens)
    finally:
        for hook in hooks:
            hook.remove()
    inside = sum(calls, Counter())
    return calls, count.where - inside


def decode_step_syncs(model, prompt: Tensor, steps: int) -> Counter[str]:
    """The syncs of generate()'s decode step (model(token, position_ids, cache)) after `steps` steps past the prompt
    (B,T), e.g. past a sliding window."""
    calls, _ = generate_syncs(model, prompt, steps + 2)
    return calls[-1]


@torch.no_grad()
def own_loop_step_syncs(model, prompt: Tensor, steps: int) -> Counter[str]:
    """The syncs of a caller's own decode step, model(token, cache=cache) (positions from the cache), after `steps`
    steps past the prompt (B,T)."""
    cache = model.new_cache()
    token = model(prompt, cache=cache)[:, -1:].argmax(-1)  # (B,1)
    for _ in range(steps + 1):
        with HostSyncCount() as count:
            token = model(token, cache=cache)[:, -1:].argmax(-1)
    return count.where
