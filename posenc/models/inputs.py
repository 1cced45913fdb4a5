"""Checks on model inputs, done before any work, so bad ids are ValueErrors, not C++ asserts.

Checking values reads them back from the device: the host waits for every queued kernel. generate() checks the
prompt once and vouches for what it feeds itself afterwards (`vouch`: the ids it drew over the vocabulary, the
positions it advanced from checked ones), so its decode steps read nothing back for the checks. Under torch.compile
the values are not read (a read would split the compiled graph and wait for the device at every call): the checks
of types and shapes hold, a value out of range fails where the eager path would have named it."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from posenc.errors import bad_value
from posenc.inference_tensors import tensor_version

# tensor -> (its version when vouched for, what its values satisfy: ("ids", V) ids in [0, V), or "positions")
_vouched: WeakIdKeyDictionary = WeakIdKeyDictionary()


def vouch(t: Tensor, holds: tuple[str, int] | str) -> Tensor:
    """Remember that posenc made t's values satisfy `holds` (("ids", V): token ids in [0, V), drawn over V logits;
    "positions": non-negative positions): the checks below then skip the read. A tensor changed in place since has
    another version and is read as any other (an inference tensor has none: vouch only for one posenc made and
    keeps to itself)."""
    _vouched[t] = (tensor_version(t), holds)
    return t


def _holds(t: Tensor, holds: tuple[str, int] | str) -> bool:
    """t was vouched for, unchanged since, with `holds` (ids: drawn over at most the vocabulary asked for)."""
    entry = _vouched.get(t)
    if entry is None or entry[0] != tensor_version(t):
        return False
    if isinstance(holds, tuple):
        return isinstance(entry[1], tuple) and entry[1][0] == holds[0] and entry[1][1] <= holds[1]
    return entry[1] == holds


def check_token_ids(input_ids: Tensor, vocab_size: int, field: str = "input_ids") -> None:
    if not isinstance(input_ids, Tensor):
        raise bad_value(field, type(input_ids).__name__, "a torch.Tensor of token ids")
    if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
        raise bad_value(f"{field}.shape/dtype", (tuple(input_ids.shape), str(input_ids.dtype)),
                        "a (batch, length) tensor of int64 token ids")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise bad_value(f"{field}.shape", tuple(input_ids.shape), "at least one sequence of at least one token")
    if torch.compiler.is_compiling() or _holds(input_ids, ("ids", vocab_size)):  # traced: values are not read
        return
    low, high = torch.stack(input_ids.aminmax()).tolist()  # one read of both
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise bad_value(field, bad, f"token ids in [0, vocab_size={vocab_size})")


def check_positions(position_ids: Tensor, like: Tensor) -> Tensor:
    if not isinstance(position_ids, Tensor) or position_ids.dtype.is_floating_point or position_ids.is_complex():
        raise bad_value("position_ids", getattr(position_ids, "dtype", type(position_ids)), "an integer tensor")
    if position_ids.dim() == 1:
        position_ids = position_ids.unsqueeze(0)
    if position_ids.shape[1] != like.shape[1] or position_ids.shape[0] not in (1, like.shape[0]):
        raise bad_value("position_ids.shape", tuple(position_ids.shape),
                        f"(batch, length) matching input_ids {tuple(like.shape)}")
    if not (torch.compiler.is_compiling() or _holds(position_ids, "positions")) and int(position_ids.min()) < 0:
        raise bad_value("position_ids", int(position_ids.min()), "non-negative positions")
    return position_ids.to(torch.int64).expand(like.shape[0], -1)
