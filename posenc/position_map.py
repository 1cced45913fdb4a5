"""The protocol of an attention position map, below both posenc.nn (which evaluates one) and posenc.position_maps
(which defines the methods): training-free context extension that changes which positions attention sees.

A method (Self-Extend, Dual Chunk Attention, LM-Infinite, attention sinks) is a few *maps*, each a pair of
position functions, P_q^m for queries and P_k^m for keys, fed to the model's own rotation (its RoPE, with
any static rope_scaling), and a *selector* saying which map scores each (query i, key j) pair, or that
key j is not attended at all (-1):

    score(i, j) = rot(q_i, P_q^m(i)) . rot(k_j, P_k^m(j)) / sqrt(Dh),   m = select(i, j)

posenc.nn.mapped_attention evaluates it in chunks of queries, merging the maps by log-sum-exp, so no
(H, T, T) tensor exists. Causality (by index) is applied there, not here. Positions are (B, T) integer
tensors as the rotary scheme frames them; `origin` (B, 1) is the position of each row's first key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from posenc.errors import bad_value
from posenc.scheme import Scheme

# The pair rules a GPU kernel evaluates per tile (posenc/nn/triton/mapped_kernels.py), d = i - j by position:
SPLIT = 0  # map 0 where d < a, else map 1 (Self-Extend's neighbour window, STRING's shifted offset)
WINDOW_AND_START = 1  # map 0 where d < a, map 1 for the first b keys from the origin, else none (LM-Infinite, sinks)
CHUNKS = 2  # chunks of a positions: min(max(i // a - j // a, 0), 2), intra / successive / inter (DCA)
PAIR_RULES = (SPLIT, WINDOW_AND_START, CHUNKS)


class PairRule(NamedTuple):
    """A selector as data: which map scores each pair, for a kernel that reads positions tile by tile. window > 0:
    pairs at d >= window are not attended (a sliding window over the map)."""

    kind: int  # one of PAIR_RULES
    a: int
    b: int = 0
    window: int = 0


@dataclass(frozen=True, kw_only=True)
class PositionMap:
    """Base of the methods. The dataclass fields are the method's options (the keys of the config dict)."""

    name: ClassVar[str]
    n_maps: ClassVar[int]
    # Each query scores only a window of recent keys and a few first ones (LM-Infinite, attention sinks), so most of a
    # long cache is keys no map scores: a decode kernel may skip whole blocks of them. A hint for speed only.
    scores_few_slots: ClassVar[bool] = False

    @property
    def period(self) -> int | None:
        """Positions at multiples of this start a new block of the selector (DCA's chunks), or None: a hint
        that lets attention align its query chunks; correctness never depends on it."""
        return None

    @property
    def plain_within(self) -> int:
        """Sequences of at most this many tokens (from the origin) are scored exactly as without the map: every
        pair either keeps its true distance or is one the map leaves untouched. 0: no such promise. Lets a sweep
        share a plain forward with a mapped one where they are the same computation."""
        return 0

    @property
    def length_scaled(self) -> bool:
        """score_scale reads n_keys (DCA's release): the first rows of a longer call are not a shorter call's, so a
        sweep must not serve a shorter length from a longer forward."""
        return False

    def score_scale(self, q_pos: Tensor, origin: Tensor, n_keys: int) -> float | Tensor:
        """Every score of a query is multiplied by this: a number for all of them, or (B,Tq) one per query. q_pos
        (B,Tq); n_keys: the keys of the call, the KV cache's included (T). 1.0 for most maps; STRING's released
        code scales cos and sin, DCA's by a function of T, Self-Extend's optional log scale each query."""
        return 1.0

    def resolved(self, max_seq_len: int) -> PositionMap:
        """Options left None take their defaults from the trained context length (max_seq_len)."""
        return self

    def replace(self, **changes: Any) -> PositionMap:
        return dataclasses.replace(self, **changes)

    def query_positions(self, q_pos: Tensor, origin: Tensor) -> tuple[Tensor, ...]:
        """(B,Tq) -> one (B,Tq) position tensor per map."""
        raise NotImplementedError

    def key_positions(self, k_pos: Tensor, origin: Tensor) -> tuple[Tensor, ...]:
        """(B,Tk) -> one (B,Tk) position tensor per map (the same tensor object when maps share it)."""
        raise NotImplementedError

    def select(self, q_pos: Tensor, k_pos: Tensor, origin: Tensor) -> Tensor:
        """(B,C), (B,Tk) -> (B,C,Tk) int8: the map scoring each pair, -1 where the key is not attended."""
        raise NotImplementedError

    def pair_rule(self) -> PairRule | None:
        """select() as data (PairRule), equal to it on every pair; None: no rule of PAIR_RULES expresses it (the
        kernels that read one decline)."""
        return None

    def spec(self) -> dict[str, Any]:
        """The config dict that builds this map again."""
        return {"type": self.name, **dataclasses.asdict(self)}


def check_outputs(built: PositionMap, field: str) -> None:
    """A map's three functions on four positions: n_maps integer position tensors of the input's shape and a
    selector of int8 values in -1..n_maps-1, so a map of one's own that breaks the protocol is one line naming it
    before any forward, not an error from inside attention."""
    try:
        with torch.device("cpu"):  # real tensors even where a model is built on the meta device (its size alone)
            pos, origin = torch.arange(4)[None], torch.zeros(1, 1, dtype=torch.long)  # (1,4), (1,1)
            outputs = {"query_positions": built.query_positions(pos, origin),
                       "key_positions": built.key_positions(pos, origin)}
            select = built.select(pos, pos, origin)
    except Exception as e:  # the user's code: its options may not fit its own arithmetic
        raise bad_value(field, built.spec(), f"options its functions run with ({type(e).__name__}: {e})") from None
    for method, out in outputs.items():
        ok = isinstance(out, tuple) and len(out) == built.n_maps and all(
            isinstance(p, torch.Tensor) and p.shape == pos.shape and not p.is_floating_point() for p in out)
        if not ok:
            raise bad_value(f"{field}.{method}", type(out).__name__ if not isinstance(out, tuple) else
                            [f"{p.dtype} {tuple(p.shape)}" if isinstance(p, torch.Tensor) else p for p in out],
                            f"a tuple of n_maps={built.n_maps} integer tensors of the positions' shape (B, T)")
    shape = (*pos.shape, pos.shape[1])
    if not isinstance(select, torch.Tensor) or select.dtype != torch.int8 or select.shape != shape \
            or select.min() < -1 or select.max() >= built.n_maps:
        seen = f"{select.dtype} {tuple(select.shape)} in {select.min()}..{select.max()}" if isinstance(
            select, torch.Tensor) else type(select).__name__
        raise bad_value(f"{field}.select", seen, f"an int8 tensor (B, Tq, Tk) of values -1..{built.n_maps - 1}")


class MappedScheme(Scheme):
    """A rotary scheme (`inner`) whose positions a PositionMap remaps per (query, key) pair. Attention
    (posenc.nn.dispatch) evaluates it map by map; rotate() leaves q and k as they are, so the KV cache stores raw
    keys and each map rotates them at its own positions."""

    shift_invariant = False  # floor division, chunks and sinks read absolute positions

    def __init__(self, inner: Scheme, position_map: PositionMap) -> None:
        super().__init__(inner.dims, inner.options)
        self.inner, self.position_map = inner, position_map

    def frame(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return self.inner.frame(q_pos, k_pos)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def extra_repr(self) -> str:
        return f"{self.position_map.spec()}"


__all__ = ["CHUNKS", "PAIR_RULES", "SPLIT", "WINDOW_AND_START", "MappedScheme", "PairRule",
           "PositionMap", "check_outputs"]
