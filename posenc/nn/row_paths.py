"""Attention whose bias is computed inside one native kernel (posenc.nn.fused_attention), for schemes that
give it in a form the kernel reads: Scheme.bias_by_distance (one row per head: ALiBi, KERPLE, Sandwich, T5),
Scheme.piecewise_bias (FIRE), Scheme.relative_rows (one row per query: Shaw, Transformer-XL) or
Scheme.contextual_rows (CoPE).
Notation as in attention.py.

Each kernel here takes a posenc.nn.dispatch.Call and returns the output or None (it does not serve); which of
them runs for which scheme, device, dtype, gradient and decode step is decided in posenc.nn.dispatch alone.
On a CUDA device (posenc.nn.triton, when triton imports) rows per head, FIRE's pieces (its MLP per tile), rows
per query (Shaw, Transformer-XL, from their tables) and CoPE run in Triton kernels, training included; rows whose
heads read their own parameters only (Scheme.head_bias: KERPLE) train in 16-bit types through triton_head_bias, which
sums the parameters' gradients per tile instead of the row gradient by distance; FIRE's pieces, whose feature reads
its c alone, likewise through triton_pieces_param (c's gradient per tile instead of the feature's), and rows read
from a table by a fixed bucket per distance (Scheme.bucket_bias: T5) through triton_bucket_bias (the table's gradient
per bucket and tile). A decode step of rows per head or of FIRE's pieces takes one bias row per step and SDPA
(posenc.nn.decode_paths).

Rows are indexed by r = n - m (key minus query). They serve when every row of positions counts up by one
(n - m = j - i - delta for key j, query i): the usual training, prompt and cached-decoding layout. Any other
layout (packed or randomized positions), another dtype or device, or dropout, returns None: the caller
falls back to the chunked or reference path, which every fast path here is tested equal to.
"""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from typing import NamedTuple

import torch
from torch import Tensor

from posenc.inference_tensors import DerivedPerTensor, LastPositions, ordinary, position_version, tensor_version
from posenc.nn import fused_attention, kept_tables, recomputed
from posenc.nn import triton as gpu
from posenc.nn.attention_core import sdpa
from posenc.nn.call import Call
from posenc.nn.kv_cache import AppendOnly, leading_entries
from posenc.scheme import BucketBias, HeadBias, PiecewiseBias, Scheme, cast

QUERY_CHUNK = 256  # queries per chunk for rows per query (Transformer-XL's span every key the chunk sees)
# Positions and rows are shared by all layers of a forward: one check and one row per forward, not per layer.
_memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # scheme -> {kind: (q_pos, k_pos, key, value)}


class Offsets(NamedTuple):
    """delta = q_pos[:, 0] - k_pos[:, 0] per batch row (n - m = j - i - delta), and its extremes."""

    delta: Tensor  # (B,) int64
    lowest: int
    highest: int


def _steps_not_one(pos: Tensor) -> Tensor | None:
    """How many steps between neighbours of pos (B,T) are not +1, as a 0-d device tensor; None when none can be (one
    position per row: a decode step's queries)."""
    if pos.shape[1] == 1:
        return None
    rows = pos[:1] if pos.stride(0) == 0 else pos  # an expanded tensor: one row to check
    return (rows.diff(dim=1) != 1).sum()


def _steps_not_one_on_host(pos: Tensor) -> int:
    """_steps_not_one of a few CPU positions (B,T), counted in Python."""
    return sum(b - a != 1 for row in pos.tolist() for a, b in itertools.pairwise(row))


def _offsets(q_pos: Tensor, k_pos: Tensor) -> Offsets | None:
    """Both checks and delta's extremes in one read of the device (each read waits for every queued kernel). Keys
    that are a KV cache's positions are checked once each: only the entries new since the last check are read."""
    if q_pos.dim() != 2 or k_pos.dim() != 2:
        return None
    delta = q_pos[:, 0] - k_pos[:, 0]
    delta = delta if delta.dtype == torch.int64 else delta.to(torch.int64)
    cached, tk = leading_entries(k_pos), k_pos.shape[1]
    if q_pos.shape[1] == 1 and q_pos.is_cpu and k_pos.is_cpu and cached is not None and 0 < cached.counted <= tk:
        return _decode_offsets(delta, k_pos, cached)
    lowest, highest = delta.aminmax()
    if cached is not None and cached.counted >= tk and cached.not_one:
        cached = None  # an older, shorter view of keys known to break somewhere: count these afresh
    known = 0 if cached is None else cached.not_one
    if cached is None or cached.counted == 0:
        keys = _steps_not_one(k_pos)
    else:  # the new entries, from the last one counted (the step between them); none new: nothing to count
        keys = _steps_not_one(k_pos[:, cached.counted - 1 :]) if tk > cached.counted else None
    wrong = [n for n in (_steps_not_one(q_pos), keys) if n is not None]
    low, high, *not_one = torch.stack((lowest, highest, *wrong)).tolist()
    if cached is not None and tk > cached.counted:
        cached.counted, cached.not_one = tk, known + (not_one[-1] if keys is not None else 0)
    return None if any(not_one) or known else Offsets(delta, low, high)


def _decode_offsets(delta: Tensor, k_pos: Tensor, cached: AppendOnly) -> Offsets | None:
    """_offsets of a decode step on the CPU (one query per row, keys a cache's positions counted before): the few
    values it needs read as Python numbers, a handful of operators where the general path runs a dozen (each costs
    ~10-15 us in a decode step, whose caches stream the keys through every layer)."""
    known, counted, tk = cached.not_one, cached.counted, k_pos.shape[1]
    if tk > counted:  # the new entries, from the last one counted
        known += _steps_not_one_on_host(k_pos[:, counted - 1 :])
        cached.counted, cached.not_one = tk, known
    if known:
        return None
    values = delta.tolist()
    return Offsets(delta, min(values), max(values))


# (B,Tq), (B,Tk) -> Offsets when every row of both counts up by one, else None; once per forward
position_offsets = LastPositions(_offsets)


def _first_keys(delta: Tensor, low: int, b: int, device: torch.device) -> Tensor:
    # ordinary: kept across calls, it must not be an inference tensor that a later training step would save
    return ordinary(lambda: fused_attention.per_batch((-delta - low).to(device), b))


# offsets.delta (1|B,), the rows' lowest r, B, device -> e = -delta - low (B,) int64 on the device: each row's index
# of its first key, as every kernel here reads it; made once per forward (every layer shares the offsets)
first_keys = DerivedPerTensor(_first_keys)


def relative_span(offsets: Offsets, tq: int, tk: int, causal: bool) -> tuple[int, int]:
    """Lowest and highest r = n - m = j - i - delta that attention reads (causal: j <= i + tk - tq)."""
    return -(tq - 1) - offsets.highest, (tk - tq if causal else tk - 1) - offsets.lowest


class _Entry(NamedTuple):
    q_pos: Tensor
    k_pos: Tensor
    key: tuple
    params: tuple[Tensor, ...]
    versions: tuple[int, ...]
    value: object


def per_forward(scheme: Scheme, kind: object, q_pos: Tensor, k_pos: Tensor, key: tuple, build,
                graph: bool = True):
    """build(), once per forward: all layers share the scheme, the positions and the parameters' versions.
    The memo keeps values, never an autograd graph (posenc.nn.recomputed): a backward frees a graph, and the
    next forward over the same positions and parameters would read the freed one. A hit compares the versions of
    the parameters the entry was built with (walking the scheme's modules for every layer cost more than a decode
    step's rows). graph=False: a value that no gradient passes through (a kernel's form of another entry's),
    built without autograd."""
    key = (key, position_version(q_pos), position_version(k_pos), torch.is_grad_enabled())
    kept = _memo.get(scheme)
    if kept is None:
        kept = _memo[scheme] = {}
    hit = kept.get(kind)
    if (hit is not None and hit.q_pos is q_pos and hit.k_pos is k_pos and hit.key == key
            and all(tensor_version(p) == v for p, v in zip(hit.params, hit.versions, strict=True))):
        return hit.value
    params = kept_tables.parameters(scheme)
    versions = tuple(tensor_version(p) for p in params)
    if graph:
        value = recomputed.shared(build, params)
    else:
        with torch.no_grad():
            value = build()
    kept[kind] = _Entry(q_pos, k_pos, key, params, versions, value)
    return value


def distance_rows(scheme: Scheme, low: int, high: int, device: torch.device) -> Tensor | None:
    """(1,H,1,S) rows over r = n - m = low..high from the scheme's bias of m - n = -r."""
    by_distance = scheme.bias_by_distance(torch.arange(-high, -low + 1, device=device))  # (H,S), m - n ascending
    return None if by_distance is None else by_distance.flip(-1)[None, :, None, :]


class Span(NamedTuple):
    offsets: Offsets
    low: int
    high: int


def span_of(call: Call) -> Span | None:
    """Where every kernel here starts: no dropout, positions that count up, and rows no longer than the scores."""
    if call.dropout != 0.0 or (offsets := position_offsets(call.q_pos, call.k_pos)) is None:
        return None
    tq, tk = call.q.shape[-2], call.k.shape[-2]
    low, high = relative_span(offsets, tq, tk, call.causal)
    if high - low + 1 > 2 * (tq + tk):  # batch rows far apart: rows would be longer than the scores
        return None
    return Span(offsets, low, high)


def _e(call: Call, offsets: Offsets, low: int) -> Tensor:
    """(B,) int64 on q's device: each batch row's index of its first key in rows starting at r = low."""
    return first_keys(offsets.delta, low, call.q.shape[0], call.q.device)


def on_gpu(call: Call) -> bool:
    return gpu.attention_fits(call.q, call.k, call.v, call.causal)


def runs_native(call: Call) -> bool:
    return fused_attention.can_run(call.q, call.k, call.v)


def _rows(call: Call, span: Span) -> Tensor | None:
    """(1,H,1,S) rows per head over span.low..span.high, once per forward for all layers."""
    scheme, device = call.scheme, call.q.device
    return per_forward(scheme, "rows", call.q_pos, call.k_pos, (span.low, span.high),
                       lambda: distance_rows(scheme, span.low, span.high, device))


def _pieces(call: Call, span: Span) -> PiecewiseBias | None:
    scheme, q_pos = call.scheme, call.q_pos
    return per_forward(scheme, "pieces", q_pos, call.k_pos, (span.low, span.high),
                       lambda: scheme.piecewise_bias(q_pos, span.low, span.high))


def _float32_pieces(call: Call, span: Span) -> PiecewiseBias | None:
    """_pieces in float32, once per forward: the kernels' gradients of them are float32, and are added up over the
    layers in float32 before they reach 16-bit parameters (once, in the rebuild's backward)."""
    scheme, q_pos = call.scheme, call.q_pos

    def build() -> PiecewiseBias | None:
        p = scheme.piecewise_bias(q_pos, span.low, span.high)
        if p is None:
            return None
        tensors = ("feature", "divisor", "knots", "slopes", "intercepts", "feature_param", "feature_derivative")
        return dataclasses.replace(p, **{name: getattr(p, name).float() for name in tensors
                                         if getattr(p, name) is not None})

    return per_forward(scheme, "float32 pieces", q_pos, call.k_pos, (span.low, span.high), build)


def native_rows(call: Call) -> Tensor | None:
    """Rows per head in the native CPU kernel (csrc/attention_*.cpp), forward and backward."""
    if not runs_native(call) or (span := span_of(call)) is None or (rows := _rows(call, span)) is None:
        return None
    return fused_attention.attend_rows(call.q, call.k, call.v, rows, _e(call, span.offsets, span.low), call.causal)[0]


def triton_rows(call: Call) -> Tensor | None:
    """Rows per head in the Triton kernel (triton/attention.py), forward and backward."""
    if not on_gpu(call) or (span := span_of(call)) is None or (rows := _rows(call, span)) is None:
        return None
    from posenc.nn.triton.attention import attend_rows  # imports triton: only once a GPU tensor shows up

    return attend_rows(call.q, call.k, call.v, rows, _e(call, span.offsets, span.low), call.causal)


def _head_bias(call: Call, span: Span) -> HeadBias | None:
    """The scheme's HeadBias over r = n - m = span.low..span.high (rows and derivatives (H,[K,]S), r ascending),
    once per forward for all layers."""
    scheme, device = call.scheme, call.q.device

    def build() -> HeadBias | None:
        by_distance = scheme.head_bias(torch.arange(-span.high, -span.low + 1, device=device))  # m - n ascending
        return None if by_distance is None else dataclasses.replace(
            by_distance, rows=by_distance.rows.flip(-1), derivatives=by_distance.derivatives.flip(-1))

    return per_forward(scheme, "head bias", call.q_pos, call.k_pos, (span.low, span.high), build)


def triton_head_bias(call: Call) -> Tensor | None:
    """Rows per head that read their own head's parameters only (Scheme.head_bias: KERPLE) in the Triton kernels
    (triton/head_bias.py): triton_rows' forward and dK/dV, the parameters' gradient summed per tile in dQ's kernel.
    Serves training only (without a gradient it is triton_rows)."""
    if not call.grad or not on_gpu(call) or (span := span_of(call)) is None:
        return None
    if (head := _head_bias(call, span)) is None:
        return None
    from posenc.nn.triton.head_bias import attend_head_bias  # imports triton: only once a GPU tensor shows up

    return attend_head_bias(call.q, call.k, call.v, head.params, head.rows, head.derivatives,
                            _e(call, span.offsets, span.low), call.causal)


def _bucket_bias(call: Call, span: Span) -> BucketBias | None:
    """The scheme's BucketBias over r = n - m = span.low..span.high (buckets (S,), r ascending; the table in float32:
    its gradients from every layer add up in float32 before they reach a 16-bit table), once per forward."""
    scheme, device = call.scheme, call.q.device

    def build() -> BucketBias | None:
        by_distance = scheme.bucket_bias(torch.arange(-span.high, -span.low + 1, device=device))  # m - n ascending
        return None if by_distance is None else BucketBias(by_distance.table.float(), by_distance.buckets.flip(-1))

    return per_forward(scheme, "bucket bias", call.q_pos, call.k_pos, (span.low, span.high), build)


def triton_bucket_bias(call: Call) -> Tensor | None:
    """Rows per head read from a table by a fixed bucket per distance (Scheme.bucket_bias: T5) in the Triton kernels
    (triton/bucket_bias.py): triton_rows' forward and dK/dV, the table's gradient summed per bucket and tile in dQ's
    kernel. Serves training only (without a gradient it is triton_rows), with at most MAX_BUCKETS buckets."""
    if not call.grad or not on_gpu(call) or (span := span_of(call)) is None:
        return None
    if (buckets := _bucket_bias(call, span)) is None:
        return None
    from posenc.nn.triton import bucket_bias  # imports triton: only once a GPU tensor shows up

    if buckets.table.shape[1] > bucket_bias.MAX_BUCKETS:
        return None
    return bucket_bias.attend_bucket_bias(call.q, call.k, call.v, buckets.table, buckets.buckets,
                                          -span.offsets.delta - span.low, call.causal)


def triton_relative(call: Call) -> Tensor | None:
    """Rows per query (Transformer-XL; Shaw with its value term) in the Triton kernel (triton/relative.py), formed
    per tile from the scheme's table (Scheme.relative_table), forward and backward."""
    if not on_gpu(call) or (span := span_of(call)) is None:
        return None
    if (relative := call.scheme.relative_table(span.low, span.high, call.q)) is None:
        return None
    from posenc.nn.triton import relative as kernel  # imports triton: only once a GPU tensor shows up

    if not kernel.serves(call.q):
        return None
    return kernel.attend_relative(call.q, call.k, call.v, relative, _e(call, span.offsets, relative.low), call.causal)


def native_pieces(call: Call) -> Tensor | None:
    """FIRE's MLP evaluated per block of scores inside the native CPU kernel."""
    if not runs_native(call) or (span := span_of(call)) is None or (pieces := _pieces(call, span)) is None:
        return None
    return fused_attention.attend_piecewise(call.q, call.k, call.v, pieces.feature, pieces.divisor, pieces.knots,
                                            pieces.slopes, pieces.intercepts, _e(call, span.offsets, pieces.low),
                                            call.causal)


def triton_pieces(call: Call) -> Tensor | None:
    """FIRE's pieces evaluated per tile inside the Triton kernel (triton/piecewise_attention.py), forward and
    backward, the feature's gradient summed by distance. The pieces as the kernels read them (float32, base-2 lines,
    the padded feature, each kernel's segment table: no gradient passes through them) are built once per forward
    for every layer, as the pieces themselves are: per layer, only the launches."""
    return _triton_pieces(call, by_parameter=False)


def triton_pieces_param(call: Call) -> Tensor | None:
    """triton_pieces for pieces whose feature reads one parameter and gives its derivative (PiecewiseBias
    .feature_param: FIRE's c): dQ's kernel sums that parameter's gradient per tile instead of the feature's by
    distance. Serves training only (without a gradient it is triton_pieces), and only such pieces."""
    return _triton_pieces(call, by_parameter=True) if call.grad else None


def _triton_pieces(call: Call, by_parameter: bool) -> Tensor | None:
    if not on_gpu(call) or (span := span_of(call)) is None or (pieces := _float32_pieces(call, span)) is None:
        return None
    if by_parameter and pieces.feature_param is None:
        return None
    from posenc.nn.triton import piecewise_attention as kernel  # imports triton: only for a GPU tensor

    q, delta = call.q, span.offsets.delta
    shape = tuple(q.shape)
    form = per_forward(call.scheme, ("kernel pieces", shape, q.dtype), call.q_pos, call.k_pos, (span.low, span.high),
                       lambda: kernel.kernel_pieces(pieces.feature, pieces.divisor, pieces.knots, pieces.slopes,
                                                    pieces.intercepts, -delta - pieces.low, shape, q.device, q.dtype,
                                                    pieces.feature_derivative),
                       graph=False)
    return kernel.attend_kernel_pieces(q, call.k, call.v, pieces.feature, pieces.divisor, pieces.slopes,
                                       pieces.intercepts, form, call.causal,
                                       pieces.feature_param if by_parameter else None)


def native_contextual(call: Call) -> Tensor | None:
    """CoPE in the native CPU kernel (causal only; it reads no positions)."""
    if call.dropout != 0.0 or not call.causal or not runs_native(call):
        return None
    if (contextual := call.scheme.contextual_rows(call.q)) is None:
        return None
    return fused_attention.attend_contextual(call.q, call.k, call.v, contextual)


def triton_contextual(call: Call) -> Tensor | None:
    """CoPE in the Triton kernel (triton/cope.py), forward and backward (causal only; it reads no positions)."""
    if call.dropout != 0.0 or not call.causal or not on_gpu(call):
        return None
    from posenc.nn.triton import cope  # imports triton: only once a GPU tensor shows up

    if not (call.q.device.type == "cpu" or cope.serves(call.q.shape[-1], call.q.dtype)):
        return None  # a head dim whose tiles spilled
    if (contextual := call.scheme.contextual_rows(call.q)) is None:
        return None
    return cope.attend_contextual(call.q, call.k, call.v, contextual)


def native_relative(call: Call) -> Tensor | None:
    """Rows per query (Transformer-XL; Shaw with its value term) in the native CPU kernel."""
    if not runs_native(call) or (span := span_of(call)) is None:
        return None
    return _relative_in_chunks(call.q, call.k, call.v, call.scheme, span.offsets, call.causal, call.grad)


def native_relative_table(call: Call) -> Tensor | None:
    """Rows per query formed inside the native CPU kernel from the scheme's RelativeTable, its value term and its
    shifts of q there too (Shaw's q . a^K and mass @ P_V, Transformer-XL's (q + v) . W_R R and q + u), without
    gradients: a decode step's products and shifts, each an operator per layer with every cache line cold after
    the previous layer's keys, become part of the one kernel call."""
    if call.grad or not runs_native(call) or (span := span_of(call)) is None:
        return None
    if (table := call.scheme.relative_table(span.low, span.high, call.q)) is None:
        return None
    values, row_shift, q_shift = (None if t is None else cast(t, torch.float32)
                                  for t in (table.values, table.row_shift, table.q_shift))
    return fused_attention.attend_table(call.q, call.k, call.v, cast(table.table, torch.float32), table.scale, values,
                                        _e(call, span.offsets, table.low), call.causal, row_shift, q_shift)


def relative_decode(call: Call) -> Tensor | None:
    """One query per row, no gradient, rows per query without a value term: SDPA with the row as the mask."""
    if not (on_gpu(call) or runs_native(call)) or (span := span_of(call)) is None:
        return None
    return _relative(call.q, call.k, call.v, call.scheme, span.offsets, span.low, span.high, call.causal,
                     as_mask=True)


def _relative_in_chunks(q: Tensor, k: Tensor, v: Tensor, scheme: Scheme, offsets: Offsets, causal: bool,
                        grad: bool) -> Tensor | None:
    """Rows per query (Scheme.relative_rows). They reach back to the first key, so long inference runs chunks
    of queries whose rows span only the keys each sees: memory of a chunk, not of (Tq, Tk). Training keeps one
    call (per chunk, autograd would add up the key and value gradients of every chunk's slice)."""
    tq, tk = q.shape[-2], k.shape[-2]
    if not causal or tq < 2 * QUERY_CHUNK or grad:
        return _relative(q, k, v, scheme, offsets, *relative_span(offsets, tq, tk, causal), causal)
    outs = []
    for start in range(0, tq, QUERY_CHUNK):
        stop, keys = min(start + QUERY_CHUNK, tq), tk - tq + min(start + QUERY_CHUNK, tq)
        chunk = Offsets(offsets.delta + start, offsets.lowest + start, offsets.highest + start)
        out = _relative(q[:, :, start:stop], k[:, :, :keys], v[:, :, :keys], scheme, chunk,
                        *relative_span(chunk, stop - start, keys, causal), causal)
        if out is None:
            return None
        outs.append(out)
    return torch.cat(outs, dim=2)  # (B,H,Tq,Dh)


def _relative(q: Tensor, k: Tensor, v: Tensor, scheme: Scheme, offsets: Offsets, low: int, high: int,
              causal: bool, as_mask: bool = False) -> Tensor | None:
    relative = scheme.relative_rows(q, low, high)  # reads q: per layer
    if relative is None:
        return None
    q_in = q if relative.q_shift is None else q + cast(relative.q_shift, q.dtype)[:, None, :]  # (H,1,Dh) broadcast
    if relative.values is None and as_mask:
        return _rows_as_mask(q_in, k, v, relative.rows, offsets, relative.low)
    out, mass = fused_attention.attend_rows(q_in, k, v, relative.rows, -relative.low - offsets.delta, causal,
                                            want_mass=relative.values is not None)  # e: index of key j - i
    return out if mass is None else out + mass @ cast(relative.values, q.dtype)  # (B,H,Tq,S) @ (S,Dh)


def _rows_as_mask(q: Tensor, k: Tensor, v: Tensor, rows: Tensor, offsets: Offsets, low: int) -> Tensor:
    """One query per row (B,H,1,Dh): SDPA with the bias as a mask, one row slice (B|1,H,1,Tk) of rows (B|1,H,1,S)."""
    bias = row_slice(rows, offsets, low, k.shape[-2], q.shape[0])
    return sdpa(q, k, v, bias if bias.dtype == q.dtype else bias.to(q.dtype), gqa=k.shape[1] != q.shape[1])


def row_slice(rows: Tensor, offsets: Offsets, low: int, tk: int, batch: int) -> Tensor:
    """The bias of one query per batch row over its tk keys, (B|1,H,1,Tk), from rows (B|1,H,1,S) over r = low..:
    a view where every row shares its offset (the usual decode step), a gather otherwise."""
    length = rows.shape[-1]
    first = -offsets.highest - low  # the lowest e
    if offsets.lowest == offsets.highest and first >= 0 and first + tk <= length:
        return rows[..., first : first + tk]  # (B|1,H,1,Tk) a view
    index = (-offsets.delta[:, None] - low + torch.arange(tk, device=rows.device)).clamp(0, length - 1)  # (B,Tk)
    return rows.expand(batch, -1, -1, -1).gather(-1, index[:, None, None].expand(-1, rows.shape[1], 1, -1))


__all__ = ["Offsets", "Span", "distance_rows", "native_contextual", "native_pieces", "native_relative",
           "native_relative_table", "native_rows", "on_gpu", "per_forward", "position_offsets", "relative_decode",
           "relative_span", "row_slice", "runs_native", "span_of", "triton_contextual", "triton_pieces",
           "triton_pieces_param", "triton_relative", "triton_rows"]
