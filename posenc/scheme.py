"""The `Scheme` base class: four hooks, all no-ops, that attention calls blindly.

A positional scheme touches attention in one of three places (DESIGN.md):
token embeddings (`embed`), q/k rotation (`rotate`) or the attention logits
(`bias`, and `score_mod`, its flex-attention form). A family overrides the hook
it needs; attention calls every hook without asking which scheme it holds.

Notation: B batch, H query heads, Hkv key/value heads, Tq queries, Tk keys,
Dh head dim, D model dim. Positions are integer tensors (B, T), never implied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn

# flex_attention's score_mod signature: (score, batch, head, q_idx, kv_idx) -> score.
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class RelativeRows:
    """Content terms read at the relative position r = n - m (key minus query), clamped to the rows' span
    [low, low + S - 1] (Shaw et al. 2018's clipping; Transformer-XL's rows span every distance present):
        logit(i, j) += rows[b, h, i, clamp(r - low, 0, S - 1)]            (after the 1/sqrt(Dh) scaling)
        out_i       += sum_j w_ij values[clamp(r - low, 0, S - 1)]         (when values is given)
    and q_shift (H, Dh) is added to q before q . k (a per-key content term u . k_j). Rows spanning the asked
    [low, high] are never read below index Tq - 1 - i in row i (no key lies before the first): a scheme may
    leave those entries zero."""

    rows: Tensor  # (B,H,Tq,S)
    low: int
    values: Tensor | None = None  # (S,Dh)
    q_shift: Tensor | None = None  # (H,Dh)


@dataclass(frozen=True)
class PiecewiseBias:
    """A bias that is a piecewise-linear function, per head, of a distance feature scaled per query:
        bias(b, h, i, j) = slopes[h, s] * x + intercepts[h, s],  x = feature[r - low] / divisor[b, i]
    at r = n - m, s = the number of knots below x. feature must not grow with r. A ReLU MLP of one input is
    exactly this, with a knot where each hidden unit turns on (FIRE)."""

    feature: Tensor  # (S,) for r = low..high
    low: int
    divisor: Tensor  # (B|1,Tq)
    knots: Tensor  # (K,) ascending
    slopes: Tensor  # (H,K+1)
    intercepts: Tensor  # (H,K+1)


@dataclass(frozen=True)
class Dims:
    """Shapes a scheme needs to build its tables; filled in by the model."""

    d_model: int
    n_head: int
    head_dim: int
    max_seq_len: int
    causal: bool = True
    n_kv_head: int | None = None


class Scheme(nn.Module):
    """Base of every positional scheme. Subclasses override one family's hook."""

    # True when logits depend only on m - n: drives the shift-invariance test.
    relative: ClassVar[bool] = True
    # True when each layer needs its own instance (per-layer learned tables, e.g. Shaw).
    per_layer: ClassVar[bool] = False
    # True when the scheme adds to the output from the attention weights (Shaw's value term):
    # attention then runs its eager path and calls mix_values.
    needs_weights: ClassVar[bool] = False
    # True when the hooks should see positions measured from the sequence's first position
    # (exact for a relative scheme; keeps xPos' exponential scale in range at any offset).
    needs_origin: ClassVar[bool] = False
    # Stacks the scheme can serve: a causal decoder, a bidirectional encoder.
    supports_causal: ClassVar[bool] = True
    supports_bidirectional: ClassVar[bool] = True

    def __init__(self, dims: Dims) -> None:
        super().__init__()
        self.dims = dims

    @classmethod
    def from_config(cls, dims: Dims, cfg: Any) -> Scheme:
        """Build from a model config; schemes with options read their fields here."""
        return cls(dims)

    @classmethod
    def check_config(cls, dims: Dims, cfg: Any) -> None:
        """Raise ValueError for a config this scheme cannot serve (called at config build)."""

    def embed(self, x: Tensor, pos: Tensor, input_ids: Tensor | None = None) -> Tensor:
        """x (B,T,D), pos (B,T) -> (B,T,D). input_ids (B,Tk), Tk >= T, when the model passes them:
        the token ids of the cached prefix followed by x's T tokens (Abacus reads digit runs)."""
        return x

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """q (B,H,Tq,Dh), k (B,Hkv,Tk,Dh) at positions (B,Tq), (B,Tk) -> rotated q, k."""
        return q, k

    def bias(self, q_pos: Tensor, k_pos: Tensor, q: Tensor | None = None,
             k: Tensor | None = None) -> Tensor | None:
        """Additive logits bias (B|1, H, Tq, Tk), or None. Added after SDPA's 1/sqrt(Dh) scaling,
        so content terms (q . r) must apply that scaling themselves. k is (B,Hkv,Tk,Dh)."""
        return None

    def mix_values(self, weights: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """Extra output from attention weights (B,H,Tq,Tk) -> (B,H,Tq,Dh); only if needs_weights."""
        return None

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> ScoreMod | None:
        """The same bias as a flex_attention score modifier (no (H,Tq,Tk) tensor), or None."""
        return None

    def bias_by_distance(self, distance: Tensor) -> Tensor | None:
        """bias() as a function of m - n alone: distance (S,) int64 -> (H,S) float32, or None (the default)
        when the bias reads anything else. Fast paths then read one row per head instead of (Tq,Tk) values."""
        return None

    def relative_rows(self, q: Tensor, low: int, high: int) -> RelativeRows | None:
        """bias() (and mix_values()) as rows read at r = n - m, for r in [low, high], or None (the default).
        q (B,H,Tq,Dh). Fast paths then never build the (B,H,Tq,Tk) bias or weights."""
        return None

    def contextual_rows(self, q: Tensor) -> Tensor | None:
        """bias() as CoPE's rows (B,H,Tq,P), or None (the default): causal attention adds rows[b, h, i] read at
        p_ij = sum_{t=j..i} sigmoid(q_i . k_t / sqrt(Dh)), linearly interpolated, p clamped to P - 1."""
        return None

    def piecewise_bias(self, q_pos: Tensor, low: int, high: int) -> PiecewiseBias | None:
        """bias() as a PiecewiseBias for r = n - m in [low, high] and queries at q_pos (B,Tq), or None (the
        default). Fast paths then evaluate it per block of scores, never as a (B,H,Tq,Tk) tensor."""
        return None

    def extra_repr(self) -> str:
        return f"relative={self.relative}"


def materialises_bias(scheme: Scheme | type[Scheme]) -> bool:
    """True when the scheme (instance or class) adds logits or reads the attention weights."""
    cls = scheme if isinstance(scheme, type) else type(scheme)
    return cls.bias is not Scheme.bias or cls.needs_weights


def relative_distance(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """(B,Tq), (B,Tk) -> m - n as (B,1,Tq,Tk) int64, broadcastable over heads."""
    return (q_pos[:, :, None] - k_pos[:, None, :]).unsqueeze(1)


def shared_row(pos: Tensor) -> Tensor:
    """(B,T) -> (1,T) when every row holds the same positions (the usual batch): tables are then
    built and gathered once and broadcast over B. A stride-0 (expanded) tensor needs no comparison."""
    if pos.dim() != 2 or pos.shape[0] < 2:
        return pos
    if pos.stride(0) == 0 or bool((pos == pos[:1]).all()):
        return pos[:1]
    return pos
