"""The `Scheme` base class: hooks, all no-ops, that attention calls blindly.

A positional scheme touches attention in one of three places (DESIGN.md):
token embeddings (`embed`), q/k rotation (`rotate`) or the attention logits
(`bias`, and `score_mod`, its flex-attention form; `mix_values` for Shaw's value term); `attend` lets a
wrapper run attention itself (the position maps of training-free context extension).
A family overrides the hook it needs; attention calls every hook without asking which
scheme it holds. `frame` decides which positions the other hooks see (the origin shift).

A scheme's options live in its own frozen dataclass (`Options`, NeMo/HF field names), next
to the scheme; model configs accept those names flat (`GPTConfig(rotary_base=...)`), so a new
scheme is one file and one registry line.

Notation: B batch, H query heads, Hkv key/value heads, Tq queries, Tk keys,
Dh head dim, D model dim. Positions are integer tensors (B, T), never implied.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from posenc.inference_tensors import LastPositions
from posenc.nn.kv_cache import from_first_entry

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
class RelativeTable:
    """relative_rows as the product it comes from, for kernels that form it per tile (the GPU's): rows are
        rows[b, h, i, s] = scale * (q_i + row_shift[h]) . table[h or 0, s]          s = r - low, S rows
    with values and q_shift as in RelativeRows. A table of one head serves every head (Shaw's P_K)."""

    table: Tensor  # (H|1,S,Dh)
    low: int
    scale: float
    row_shift: Tensor | None = None  # (H,Dh)
    values: Tensor | None = None  # (S,Dh)
    q_shift: Tensor | None = None  # (H,Dh)


@dataclass(frozen=True)
class PiecewiseBias:
    """A bias that is a piecewise-linear function, per head, of a distance feature scaled per query:
        bias(b, h, i, j) = slopes[h, s] * x + intercepts[h, s],  x = feature[r - low] / divisor[b, i]
    at r = n - m, s = the number of knots below x. feature must not grow with r. A ReLU MLP of one input is
    exactly this, with a knot where each hidden unit turns on (FIRE).
    A feature that reads one parameter theta alone (FIRE's c) may come with it and its closed-form derivative:
        feature_param = theta (one value, in autograd's graph),  feature_derivative[s] = d feature[s] / d theta
    and a training kernel then sums the feature's gradient per tile into theta's (dS slope inv derivative per pair)
    instead of into the feature's by distance (posenc.nn.triton.piecewise_attention). A kernel takes the feature's
    gradient through feature or through feature_param, never both; feature_derivative carries none."""

    feature: Tensor  # (S,) for r = low..high
    low: int
    divisor: Tensor  # (B|1,Tq)
    knots: Tensor  # (K,) ascending
    slopes: Tensor  # (H,K+1)
    intercepts: Tensor  # (H,K+1)
    feature_param: Tensor | None = None  # () theta
    feature_derivative: Tensor | None = None  # (S,) float32, d feature / d theta


@dataclass(frozen=True)
class HeadBias:
    """bias_by_distance whose row per head depends on that head's parameters only, with the rows' derivatives:
        rows[h, s] = f(distance[s]; params[h, 0..K-1]),   derivatives[h, k, s] = d rows[h, s] / d params[h, k]
    Gradients reach the scheme through params (a tensor in autograd's graph); rows and derivatives carry none. A
    kernel then sums dS * derivatives per pair into dL/dparams (H,K) instead of the row gradient by distance."""

    params: Tensor  # (H,K), K <= MAX_HEAD_PARAMS
    rows: Tensor  # (H,S) float32
    derivatives: Tensor  # (H,K,S) float32


MAX_HEAD_PARAMS = 3  # the kernels' accumulators per head (head_bias_kernels.py)


@dataclass(frozen=True)
class BucketBias:
    """bias_by_distance as a lookup in a table of a few values per head, by a fixed bucket per distance:
        rows[h, s] = table[h, buckets[s]]
    Gradients reach the scheme through table (a tensor in autograd's graph); buckets carry none. A kernel then sums
    dS per bucket and tile into dL/dtable (H,NB) instead of the row gradient by distance (T5's buckets: past
    max_distance every distance shares the last bucket, so far tiles hold one bucket each)."""

    table: Tensor  # (H,NB)
    buckets: Tensor  # (S,) int64 in [0, NB)


@dataclass(frozen=True)
class RotationTables:
    """rotate() as tables of cos and sin (posenc.rotary.apply_rotary's): rotate(q, k) is apply_rotary(q, cos_q,
    sin_q, interleaved), apply_rotary(k, cos_k, sin_k, interleaved). A decode step computes them once for every
    layer and a step captured whole (posenc.models.static_decode) reads them from fixed buffers."""

    cos_q: Tensor  # (B|1,1,Tq,R/2)
    sin_q: Tensor
    cos_k: Tensor  # (B|1,1,Tk,R/2); the same tensors as cos_q, sin_q where q and k rotate alike (RoPE)
    sin_k: Tensor
    interleaved: bool


@dataclass(frozen=True)
class Dims:
    """What a scheme needs from the model to build its tables; filled in by the model config."""

    d_model: int
    n_head: int
    head_dim: int
    max_seq_len: int
    causal: bool = True
    n_kv_head: int | None = None
    init_std: float = 0.02  # std of the token embeddings: absolute schemes match their scale to it
    max_position: int | None = None  # largest position id training feeds (randomized positions); None: max_seq_len - 1


@dataclass(frozen=True, kw_only=True)
class NoOptions:
    """The options of a scheme that has none."""


class Scheme(nn.Module):
    """Base of every positional scheme. Subclasses override one family's hook."""

    # The scheme's own options: a frozen, kw-only dataclass validated in __post_init__.
    Options: ClassVar[type] = NoOptions
    # True when logits depend only on m - n, so moving every position by k changes nothing:
    # drives the shift-invariance property of the contract suite.
    shift_invariant: ClassVar[bool] = True
    # True when each layer needs its own instance (per-layer learned tables, e.g. Shaw).
    per_layer: ClassVar[bool] = False
    # True when the scheme adds to the output from the attention weights (Shaw's value term):
    # attention then runs its eager path and calls mix_values.
    needs_weights: ClassVar[bool] = False
    # True when the scheme's parameters are a few per-head scalars in logit units (T5's bucket biases,
    # KERPLE's b, a, p): the trainer gives them trainer.bias_lr_scale x the learning rate, since Adam
    # moves each by about lr per step and a short run cannot otherwise reach biases of a few nats.
    bias_parameters: ClassVar[bool] = False
    # Stacks the scheme can serve: a causal decoder, a bidirectional encoder.
    supports_causal: ClassVar[bool] = True
    supports_bidirectional: ClassVar[bool] = True
    # Buffers holding constants derived from the config (RoPE's frequencies) that must not be rounded when the model
    # is cast to float16 or bfloat16: model.to(torch.bfloat16) would round inv_freq to 8 bits of mantissa, and at
    # position p an angle p * inv_freq then errs by p * inv_freq * 2^-9 radians (~8 rad at p = 8k). They follow the
    # model's device and a cast up (float64), never a cast down.
    exact_buffers: ClassVar[tuple[str, ...]] = ()

    def __init__(self, dims: Dims, options: Any = None, **flat: Any) -> None:
        """options: an instance of `Options`; or its fields as keywords (`KERPLE(dims, kerple_kernel="power")`).
        A subclass that builds tables or parameters keeps this signature and calls super().__init__ first."""
        super().__init__()
        if options is not None and flat:
            raise TypeError(f"{type(self).__name__}: give options or keyword options, not both")
        self.dims = dims
        self.options = options if options is not None else type(self).Options(**flat)

    @classmethod
    def check_config(cls, dims: Dims, options: Any) -> None:
        """The one validator a model config calls: raise ValueError if these options cannot serve a model
        of these dims (the options validated their own values when they were built). Must not allocate."""

    def frame(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """The positions every other hook sees, from the model's query (B,Tq) and key (B,Tk) positions
        (k_pos includes the cached keys). Identity; see `from_first_key` for schemes that measure
        from the sequence's first position."""
        return q_pos, k_pos

    def embed(self, x: Tensor, pos: Tensor, input_ids: Tensor | None = None) -> Tensor:
        """x (B,T,D), pos (B,T) -> (B,T,D). input_ids (B,Tk), Tk >= T: the token ids of the cached
        prefix followed by x's T tokens (Abacus reads digit runs)."""
        return x

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """q (B,H,Tq,Dh), k (B,Hkv,Tk,Dh) at positions (B,Tq), (B,Tk) -> rotated q, k."""
        return q, k

    def rotation_tables(self, q_pos: Tensor, k_pos: Tensor) -> RotationTables | None:
        """rotate() for queries at q_pos (B,Tq) and keys at k_pos (B,Tk) as RotationTables, or None (the default:
        the scheme does not rotate, or not by tables). The static decode step serves a scheme that rotates only
        where this gives its tables."""
        return None

    def attend(self, q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, causal: bool,
               dropout: float = 0.0) -> Tensor | None:
        """Attention run by the scheme itself: q (B,H,Tq,Dh) and k, v (B,Hkv,Tk,Dh, cache included) as rotate()
        left them -> (B,H,Tq,Dh); or None (the default), and attention runs its own paths. Position maps
        (posenc.position_maps: Self-Extend, Dual Chunk Attention, ...) score each pair at remapped positions."""
        return None

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

    def head_bias(self, distance: Tensor) -> HeadBias | None:
        """bias_by_distance(distance) as a HeadBias, or None (the default): a scheme declares by overriding this
        that each head's row depends on its own head's parameters only (at most MAX_HEAD_PARAMS of them), and a
        training kernel sums their gradients per tile (posenc.nn.dispatch's head_distance form)."""
        return None

    def bucket_bias(self, distance: Tensor) -> BucketBias | None:
        """bias_by_distance(distance) as a BucketBias, or None (the default): a scheme declares by overriding this that
        its rows are a table read at a fixed bucket per distance, and a training kernel sums the table's gradient per
        bucket and tile (posenc.nn.dispatch's bucket_distance form)."""
        return None

    def relative_rows(self, q: Tensor, low: int, high: int) -> RelativeRows | None:
        """bias() (and mix_values()) as rows read at r = n - m, for r in [low, high], or None (the default).
        q (B,H,Tq,Dh). Fast paths then never build the (B,H,Tq,Tk) bias or weights."""
        return None

    def relative_table(self, low: int, high: int, like: Tensor) -> RelativeTable | None:
        """relative_rows for r in [low, high] as a RelativeTable (no rows per query), or None (the default).
        like: a tensor of the queries' device and dtype."""
        return None

    def contextual_rows(self, q: Tensor) -> Tensor | None:
        """bias() as CoPE's rows (B,H,Tq,P), or None (the default): causal attention adds rows[b, h, i] read at
        p_ij = sum_{t=j..i} sigmoid(q_i . k_t / sqrt(Dh)), linearly interpolated, p clamped to P - 1."""
        return None

    def piecewise_bias(self, q_pos: Tensor, low: int, high: int) -> PiecewiseBias | None:
        """bias() as a PiecewiseBias for r = n - m in [low, high] and queries at q_pos (B,Tq), or None (the
        default). Fast paths then evaluate it per block of scores, never as a (B,H,Tq,Tk) tensor."""
        return None

    def _apply(self, fn: Any, recurse: bool = True) -> Scheme:
        """nn.Module._apply (every .to(), .half(), .cuda()), except that exact_buffers never lose precision: a cast
        that would lower it moves them to the new device with their values untouched; a cast up follows."""
        before = {name: self._buffers[name] for name in self.exact_buffers if self._buffers.get(name) is not None}
        super()._apply(fn, recurse)
        for name, old in before.items():
            new = self._buffers[name]
            if new is not None and new.is_floating_point() and torch.finfo(new.dtype).eps > torch.finfo(old.dtype).eps:
                self._buffers[name] = old.to(new.device)
        return self

    def extra_repr(self) -> str:
        changed = {f.name: getattr(self.options, f.name) for f in dataclasses.fields(self.options)
                   if getattr(self.options, f.name) != _default(f)}
        return ", ".join(f"{k}={v!r}" for k, v in changed.items())


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING


def from_first_key(q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
    """Positions measured from each row's first key (the first cached position when decoding): for a
    scheme whose logits depend only on m - n this changes nothing mathematically, and it keeps values
    that grow with the absolute position (xPos' zeta^n, FIRE's psi(i)) independent of any offset."""
    shifted_keys = from_first_entry(k_pos)  # (B,Tk); a cache's keys: kept across steps, each step's new ones subtracted
    return (shifted_keys if q_pos is k_pos else q_pos - k_pos[:, :1]), shifted_keys


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


def expanded_row(pos: Tensor) -> Tensor:
    """shared_row without reading values (under torch.compile): (1,T) only for rows expanded from one (stride 0,
    as the models' default positions are), else pos."""
    return pos[:1] if pos.dim() == 2 and pos.shape[0] > 1 and pos.stride(0) == 0 else pos


def extremes(pos: Tensor) -> tuple[int, int]:
    """(lowest, highest) position of pos (any shape; (0, 0) when empty), read with one synchronisation."""
    if pos.numel() <= 1:
        only = int(pos.item()) if pos.numel() else 0  # (one operator: reshape first was two)
        return only, only
    lowest, highest = pos.aminmax()
    return int(lowest), int(highest)


def _row_and_extremes(pos: Tensor) -> tuple[Tensor, int, int]:
    """(shared_row(pos), *extremes(pos)) with one read of the device."""
    if pos.numel() <= 1:
        return (pos, *extremes(pos))
    lowest, highest = pos.aminmax()
    compare = pos.dim() == 2 and pos.shape[0] >= 2 and pos.stride(0) != 0  # shared_row's comparison
    if not compare:
        low, high = torch.stack((lowest, highest)).tolist()
        return (pos[:1] if pos.dim() == 2 and pos.shape[0] >= 2 else pos), int(low), int(high)
    low, high, same = torch.stack((lowest, highest, (pos == pos[:1]).all().to(lowest.dtype))).tolist()
    return (pos[:1] if same else pos), int(low), int(high)


# (shared_row(pos), *extremes(pos)), kept for the positions tensor: every layer and every scheme of a forward
# (Gemma's local and global RoPE) receive the same one.
shared_row_extremes = LastPositions(_row_and_extremes)


def cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    """t in dtype: t itself when it is already (a no-op .to() is still an operator call, and a decode step pays
    the hooks' calls in every layer)."""
    return t if t.dtype == dtype else t.to(dtype)
