"""Attention with a positional bias computed inside one native kernel, forward and backward
(posenc/nn/csrc/attention_*.cpp); no (B, H, Tq, Tk) tensor exists. Notation as in attention.py.

Two kinds of bias, each with an autograd function whose gradients reach the bias's own inputs:
  rows:      bias(b, h, i, j) = rows[b, h, i, clamp(e[b] - i + j, 0, S - 1)]; rows (B|1, H, Tq|1, S) hold a bias
             of the distance (one row per head) or a content term (one row per query, Shaw's q . a^K), and the
             optional `mass` (B, H, Tq, S) is the softmax weight landing on each row index (Shaw's value term).
  piecewise: bias(b, h, i, j) = slope[h, s] x + intercept[h, s], x = feature[e[b] - i + j] / divisor[b, i],
             s = the number of knots below x (FIRE's MLP of one input, exactly).
  contextual: CoPE's rows (B, H, Tq, P) read at positions counted by the gates sigmoid(q . k), causal only.
float32 on CPU only; can_run() says where the kernels serve.
"""

from __future__ import annotations

import ctypes
import struct

import torch
from torch import Tensor

from posenc.nn import native
from posenc.nn.kernel_checks import check_contextual, check_operands, check_piecewise, check_rows, check_table

_I64x3 = ctypes.c_int64 * 3
_FLOAT_P = ctypes.c_void_p


class Attention(ctypes.Structure):  # mirrors csrc/attention.h
    _fields_ = [*((n, _FLOAT_P) for n in ("q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv")),
                *((f"{n}_strides", _I64x3) for n in ("q", "k", "v", "o", "do", "dq", "dk", "dv")),
                *((n, ctypes.c_int64) for n in ("B", "H", "Hkv", "Tq", "Tk", "D")), ("scale", ctypes.c_float),
                ("causal", ctypes.c_int32), ("q_block", ctypes.c_int64), ("kv_block", ctypes.c_int64),
                ("threads", ctypes.c_int32)]


class RowArgs(ctypes.Structure):
    _fields_ = [("rows", _FLOAT_P), ("strides", _I64x3), ("length", ctypes.c_int64), ("e", _FLOAT_P),
                ("grad", _FLOAT_P), ("mass", _FLOAT_P), ("dmass", _FLOAT_P), ("mass_strides", _I64x3),
                ("table", _FLOAT_P), ("table_stride_h", ctypes.c_int64), ("table_scale", ctypes.c_float),
                ("values", _FLOAT_P), ("row_shift", _FLOAT_P), ("q_shift", _FLOAT_P)]


class PiecewiseArgs(ctypes.Structure):
    _fields_ = [("feature", _FLOAT_P), ("length", ctypes.c_int64), ("e", _FLOAT_P), ("divisor", _FLOAT_P),
                ("divisor_stride_b", ctypes.c_int64), ("divisor_rows", ctypes.c_int64), ("knots", _FLOAT_P),
                ("n_knots", ctypes.c_int64), ("slope", _FLOAT_P), ("intercept", _FLOAT_P),
                *((n, _FLOAT_P) for n in ("d_feature", "d_divisor", "d_slope", "d_intercept"))]


class CopeArgs(ctypes.Structure):
    _fields_ = [("rows", _FLOAT_P), ("positions", ctypes.c_int64), ("grad", _FLOAT_P)]


FEW_QUERIES = 4  # up to this many query rows (a decode step) run as one block of up to DECODE_KEYS keys
DECODE_KEYS = 4096


def blocks(tq: int) -> tuple[int, int]:
    """(query rows, key columns) per block, as SDPA's CPU kernel chooses them; a few queries (a decode step) take
    their own count of rows and longer key blocks: a block of 32 rows zero-filled 32x the scores one query needs,
    and 512 keys made 16 GEMM calls per head at 4k keys (one query against 4k keys: ~10% slower than SDPA, then
    at its speed)."""
    if tq <= FEW_QUERIES:
        return max(tq, 1), DECODE_KEYS
    return (256 if tq >= 768 else 64 if tq >= 192 else 32), 512


def _strides(t: Tensor) -> ctypes.Array:
    return _I64x3(*_stride_values(t))


def _stride_values(t: Tensor) -> tuple[int, int, int]:
    """(b, h, t) strides of a (B, H, T, Dh) operand: 0 on a size-1 axis; t's is a BLAS leading dimension (>= Dh)."""
    b, h, n, d = t.shape
    return t.stride(0) if b > 1 else 0, t.stride(1) if h > 1 else 0, t.stride(2) if n > 1 else d


def _row_strides(t: Tensor | None) -> ctypes.Array:
    """(b, h, i) strides of (B|1, H, Tq|1, S) rows: 0 where one row serves the whole axis."""
    if t is None:
        return _I64x3(0, 0, 0)
    return _I64x3(*(s if n > 1 else 0 for s, n in zip(t.stride()[:3], t.shape[:3], strict=True)))


def _dense_last(t: Tensor) -> Tensor:
    """A contiguous last dim, and rows that do not overlap: the (b, h, t) strides become BLAS leading dimensions,
    which must be >= Dh (an expanded sequence axis has stride 0: MKL refuses it and leaves the output unwritten)."""
    rows_apart = t.dim() != 4 or t.shape[2] == 1 or t.stride(2) >= t.shape[3]
    return t if t.stride(-1) == 1 and rows_apart else t.contiguous()


def _packing(cls: type[ctypes.Structure]) -> struct.Struct:
    """A struct.Struct that writes cls's bytes, its fields in order (checked against ctypes' offsets once)."""
    codes = {_FLOAT_P: "P", _I64x3: "3q", ctypes.c_int64: "q", ctypes.c_float: "f", ctypes.c_int32: "i"}
    layout = "@"
    for name, kind in cls._fields_:
        layout += codes[kind]
        offset = getattr(cls, name).offset
        if struct.calcsize(layout) != offset + ctypes.sizeof(kind):
            raise RuntimeError(f"{cls.__name__}.{name}: struct layout {layout!r} puts it elsewhere than ctypes")
    return struct.Struct(layout + "x" * (ctypes.sizeof(cls) - struct.calcsize(layout)))


_ATTENTION_BYTES, _ROW_ARGS_BYTES = _packing(Attention), _packing(RowArgs)
_POINTERS = struct.Struct("@5P")  # Attention's first fields: q, k, v, out, lse
if _POINTERS.size != Attention.dout.offset:
    raise RuntimeError("Attention: q, k, v, out and lse are not its first five fields")
_NO_GRADS, _NO_GRAD_STRIDES = (0,) * 4, (0,) * 12  # dout, dq, dk, dv (null) and their strides


def _attention(q, k, v, out, lse, causal, scale, grads=None) -> Attention:
    """The kernel's view of the operands (lse None: a forward that writes none); grads = (dout, dq, dk, dv) for
    the backward. (Packed with struct and copied in once: a decode step builds this in every layer, and ctypes'
    keywords cost ~2x.)"""
    attention = Attention.from_buffer_copy(_pointers(q, k, v, out, lse) + _layout_bytes(q, k, v, out, causal, scale,
                                                                                       grads is not None))
    if grads is not None:
        for name, t in zip(("do", "dq", "dk", "dv"), grads, strict=True):
            setattr(attention, "dout" if name == "do" else name, native.ptr(t))
            setattr(attention, f"{name}_strides", _strides(t))
    return attention


def _pointers(q, k, v, out, lse) -> bytes:
    return _POINTERS.pack(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                          0 if lse is None else lse.data_ptr())


def _layout_bytes(q, k, v, out, causal, scale, backward=False) -> bytes:
    """Attention's bytes after its first five pointers: the gradients' null pointers and strides, the operands'
    strides, the sizes, the blocks and the thread count (all the layouts and the thread count decide)."""
    b, h, tq, d = q.shape
    q_block, kv_block = blocks(tq)
    return _ATTENTION_BYTES.pack(
        0, 0, 0, 0, 0, *_NO_GRADS, *_stride_values(q), *_stride_values(k), *_stride_values(v), *_stride_values(out),
        *_NO_GRAD_STRIDES, b, h, k.shape[1], tq, k.shape[2], d, scale, int(causal),
        min(q_block, 64) if backward else q_block, kv_block, native.threads())[_POINTERS.size :]


def _zeros_like_operands(q, k, v):
    return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)  # the kernel accumulates


def _rows_forward(q, k, v, rows, e, causal, scale, want_mass):
    """The row kernel's forward: (out, lse, mass or None) and the dense operands it read."""
    q, k, v, rows = _dense_last(q), _dense_last(k), _dense_last(v), rows.contiguous()
    out, lse = torch.empty_like(q), torch.empty(q.shape[:3])  # lse: the backward recomputes weights from it
    mass = torch.empty(*q.shape[:3], rows.shape[-1]) if want_mass else None
    args = RowArgs(native.ptr(rows), _row_strides(rows), rows.shape[-1], native.ptr(e), None, native.ptr(mass),
                   None, _row_strides(mass))
    attention = _attention(q, k, v, out, lse, causal, scale)
    native.library().posenc_attention_rows_forward(ctypes.addressof(attention), ctypes.addressof(args))
    return out, lse, mass, (q, k, v, rows)


class _RowBiasAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, rows, e, causal, scale, want_mass):
        out, lse, mass, (q, k, v, rows) = _rows_forward(q, k, v, rows, e, causal, scale, want_mass)
        ctx.save_for_backward(q, k, v, out, lse, rows, e, mass)
        ctx.causal, ctx.scale = causal, scale
        if mass is None:
            mass = torch.empty(0)
            ctx.mark_non_differentiable(mass)
        return out, mass

    @staticmethod
    def backward(ctx, dout, dmass):
        q, k, v, out, lse, rows, e, mass = ctx.saved_tensors
        dq, dk, dv = _zeros_like_operands(q, k, v)
        drow = torch.empty_like(rows) if ctx.needs_input_grad[3] else None  # the kernel writes it all
        dmass = dmass.contiguous() if mass is not None else None
        args = RowArgs(native.ptr(rows), _row_strides(rows), rows.shape[-1], native.ptr(e), native.ptr(drow),
                       native.ptr(mass), native.ptr(dmass), _row_strides(mass))
        dout = _dense_last(dout)  # a local: the kernel reads it through a raw pointer
        attention = _attention(q, k, v, out, lse, ctx.causal, ctx.scale, (dout, dq, dk, dv))
        native.library().posenc_attention_rows_backward(ctypes.addressof(attention), ctypes.addressof(args))
        return dq, dk, dv, drow, None, None, None, None


class _PiecewiseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, feature, divisor, slope, intercept, knots, e, causal, scale):
        q, k, v = _dense_last(q), _dense_last(k), _dense_last(v)
        feature, divisor, slope, intercept = (t.contiguous() for t in (feature, divisor, slope, intercept))
        out, lse = torch.empty_like(q), torch.empty(q.shape[:3])
        args = _piecewise_args(feature, divisor, slope, intercept, knots, e)
        attention = _attention(q, k, v, out, lse, causal, scale)
        native.library().posenc_attention_piecewise_forward(ctypes.addressof(attention), ctypes.addressof(args))
        ctx.save_for_backward(q, k, v, out, lse, feature, divisor, slope, intercept, knots, e)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, feature, divisor, slope, intercept, knots, e = ctx.saved_tensors
        dq, dk, dv = _zeros_like_operands(q, k, v)
        grads = [torch.zeros_like(t) for t in (feature, divisor, slope, intercept)]
        args = _piecewise_args(feature, divisor, slope, intercept, knots, e, grads)
        dout = _dense_last(dout)  # a local: the kernel reads it through a raw pointer
        attention = _attention(q, k, v, out, lse, ctx.causal, ctx.scale, (dout, dq, dk, dv))
        native.library().posenc_attention_piecewise_backward(ctypes.addressof(attention), ctypes.addressof(args))
        return dq, dk, dv, *grads, None, None, None, None


def _contextual_forward(q, k, v, rows, scale):
    """CoPE's kernel forward: (out, lse) and the dense operands it read."""
    q, k, v, rows = _dense_last(q), _dense_last(k), _dense_last(v), rows.contiguous()
    out, lse = torch.empty_like(q), torch.empty(q.shape[:3])
    args, attention = CopeArgs(native.ptr(rows), rows.shape[-1], None), _attention(q, k, v, out, lse, True, scale)
    native.library().posenc_cope_forward(ctypes.addressof(attention), ctypes.addressof(args))
    return out, lse, (q, k, v, rows)


class _ContextualAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, rows, scale):
        out, lse, (q, k, v, rows) = _contextual_forward(q, k, v, rows, scale)
        ctx.save_for_backward(q, k, v, out, lse, rows)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, rows = ctx.saved_tensors
        dq, dk, dv = _zeros_like_operands(q, k, v)
        drows = torch.zeros_like(rows)
        dout = _dense_last(dout)  # a local: the kernel reads it through a raw pointer
        args = CopeArgs(native.ptr(rows), rows.shape[-1], native.ptr(drows))
        attention = _attention(q, k, v, out, lse, True, ctx.scale, (dout, dq, dk, dv))
        native.library().posenc_cope_backward(ctypes.addressof(attention), ctypes.addressof(args))
        return dq, dk, dv, drows, None


def _piecewise_args(feature, divisor, slope, intercept, knots, e, grads=None) -> PiecewiseArgs:
    """divisor (B|1, Tq) contiguous; slope/intercept (H, K+1) contiguous; knots (K,)."""
    g = [native.ptr(t) for t in grads] if grads else [None] * 4
    return PiecewiseArgs(native.ptr(feature), feature.shape[-1], native.ptr(e), native.ptr(divisor),
                         divisor.shape[-1] if divisor.shape[0] > 1 else 0, divisor.shape[0], native.ptr(knots),
                         knots.shape[0], native.ptr(slope), native.ptr(intercept), *g)


def piecewise_row(feature: Tensor, divisor: Tensor, knots: Tensor, slope: Tensor, intercept: Tensor,
                  first: list[int], tk: int) -> Tensor | None:
    """A decode step's piecewise bias row, (B,H,1,Tk) float32: bias(b, h, j) = slope[h, s] x + intercept[h, s], x =
    feature[first[b] + j] / divisor[b, 0], s = the number of knots below x; B = len(first) (one entry: a row shared
    by the batch), divisor (B|1,1). None where the native kernel does not serve (not float32 on the CPU, no library,
    an index outside the feature): the caller's PyTorch formula then does."""
    tensors = (feature, divisor, knots, slope, intercept)
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in tensors) or (lib := native.library()) is None:
        return None
    if min(first) < 0 or max(first) + tk > feature.shape[0]:
        return None
    b, h = len(first), slope.shape[0]
    if divisor.shape[0] > 1:
        divisor = divisor[:, :1].contiguous()  # (B,1): the kernel steps one float per batch row
    feature, knots, slope, intercept = (t.contiguous() for t in (feature, knots, slope, intercept))
    out = torch.empty(b, h, 1, tk)
    e = native.int64s(*first)
    args = PiecewiseArgs(native.ptr(feature), feature.shape[0], ctypes.addressof(e), native.ptr(divisor),
                         1 if divisor.shape[0] > 1 else 0, divisor.shape[0], native.ptr(knots), knots.shape[0],
                         native.ptr(slope), native.ptr(intercept), None, None, None, None)
    lib.posenc_piecewise_row(ctypes.addressof(args), b, h, tk, out.data_ptr())
    return out


def per_batch_row(e: Tensor, q: Tensor) -> Tensor:
    """e (1|B,) -> (B,) int64: the kernels read e[b] for every batch row of q (positions given once for the
    whole batch, (1,T), would otherwise be read past their end)."""
    return per_batch(e, q.shape[0])


def per_batch(e: Tensor, b: int) -> Tensor:
    """per_batch_row for B = b."""
    if e.dim() != 1 or e.shape[0] not in (1, b):
        raise ValueError(f"row offsets e have shape {tuple(e.shape)}; expected (1,) or ({b},): one per batch row")
    if e.dtype == torch.int64 and e.shape[0] == b and e.is_contiguous():
        return e  # already what the kernels read (a decode step of one row)
    return e.to(torch.int64).expand(b).contiguous()


def _autograd(*tensors: Tensor) -> bool:
    """A backward may reach these inputs; otherwise the kernels run without an autograd node (a decode step)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def can_run(q: Tensor, k: Tensor, v: Tensor) -> bool:
    return (q.device.type == "cpu" and q.dtype == k.dtype == v.dtype == torch.float32 and q.dim() == 4
            and q.shape[-1] == k.shape[-1] == v.shape[-1] and q.shape[1] % k.shape[1] == 0 and native.has_gemm())


def attend_rows(q: Tensor, k: Tensor, v: Tensor, rows: Tensor, e: Tensor, causal: bool,
                want_mass: bool = False) -> tuple[Tensor, Tensor | None]:
    """q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh), rows (B|1,H,Tq|1,S), e (B,) int64 -> out (B,H,Tq,Dh) and, if asked,
    mass (B,H,Tq,S). Only where can_run(q, k, v); any other shape is refused before the kernel runs."""
    check_operands(q, k, v, causal)
    rows, e = (rows if rows.dtype == torch.float32 else rows.to(torch.float32)), per_batch_row(e, q)
    check_rows(rows, q, e)
    if not _autograd(q, k, v, rows):
        out, _, mass, _ = _rows_forward(q, k, v, rows, e, causal, q.shape[-1] ** -0.5, want_mass)
        return out, mass
    out, mass = _RowBiasAttention.apply(q, k, v, rows, e, causal, q.shape[-1] ** -0.5, want_mass)
    return out, (mass if want_mass else None)


def attend_table(q: Tensor, k: Tensor, v: Tensor, table: Tensor, table_scale: float, values: Tensor | None,
                 e: Tensor, causal: bool, row_shift: Tensor | None = None, q_shift: Tensor | None = None) -> Tensor:
    """attend_rows with rows = table_scale * (q + row_shift[h]) . table[h] (B,H,Tq,S) formed in the kernel, out +=
    mass @ values where values are given, and the scores' query q + q_shift[h]: table (H|1,S,Dh) with rows of Dh
    contiguous, values (S,Dh), row_shift and q_shift (H,Dh), e (B,) int64 -> (B,H,Tq,Dh) (Scheme.RelativeTable's
    terms). No gradient (a decode step: the rows' product and the value term's operators less per layer); refused
    where one is wanted."""
    extra = tuple(t for t in (values, row_shift, q_shift) if t is not None)
    if _autograd(q, k, v, table, *extra):
        raise ValueError("attend_table runs without gradients (use attend_rows with relative_rows for a backward)")
    e = per_batch_row(e, q)
    layout = (causal, native.threads(), *map(_layout, (q, k, v, table, values, row_shift, q_shift, e)))
    tail = _table_layouts.get(layout)
    copied = False
    if tail is None:  # layouts not met yet: checked, and kept below where no operand needs a copy
        check_operands(q, k, v, causal)
        check_table(table, values, row_shift, q_shift, q, e)
        dense = _dense_last(q), _dense_last(k), _dense_last(v)
        copied = any(a is not b for a, b in zip(dense, (q, k, v), strict=True))
        q, k, v = dense
    out = torch.empty_like(q)  # and no log-sum-exp (a null lse): no backward reads it
    if tail is None:
        tail = _layout_bytes(q, k, v, out, causal, q.shape[-1] ** -0.5)
        if not copied:
            if len(_table_layouts) >= KEPT_LAYOUTS:
                _table_layouts.clear()
            _table_layouts[layout] = tail
    args = RowArgs.from_buffer_copy(_ROW_ARGS_BYTES.pack(  # rows, their strides, grad, mass, dmass: none here
        0, 0, 0, 0, table.shape[1], e.data_ptr(), 0, 0, 0, 0, 0, 0, table.data_ptr(),
        table.stride(0) if table.shape[0] > 1 else 0, table_scale, 0 if values is None else values.data_ptr(),
        0 if row_shift is None else row_shift.data_ptr(), 0 if q_shift is None else q_shift.data_ptr()))
    attention = Attention.from_buffer_copy(_pointers(q, k, v, out, None) + tail)
    native.library().posenc_attention_rows_forward(ctypes.addressof(attention), ctypes.addressof(args))
    return out


def _layout(t: Tensor | None) -> tuple | None:
    return None if t is None else (t.dtype, t.is_cpu, t.shape, t.stride())


# attend_table's operand layouts met and checked -> their _layout_bytes. A decode step calls it in every layer with
# the same layouts (its key length new each step): the checks and the packing of strides and sizes run in the first
# layer, the others copy them in (in the model, 15 checks and packings cost ~40 us a layer, cold after the layer's
# weights; a layout kept is only ever one that passed the checks, and every check reads layouts alone).
KEPT_LAYOUTS = 8
_table_layouts: dict[tuple, bytes] = {}


def attend_piecewise(q: Tensor, k: Tensor, v: Tensor, feature: Tensor, divisor: Tensor, knots: Tensor,
                     slope: Tensor, intercept: Tensor, e: Tensor, causal: bool) -> Tensor:
    """feature (S,) non-increasing, divisor (B|1,Tq), knots (K,) ascending, slope/intercept (H,K+1), e (B,)
    -> (B,H,Tq,Dh). Only where can_run(q, k, v); any other shape is refused before the kernel runs."""
    check_operands(q, k, v, causal)
    feature, divisor, slope, intercept = (t.to(torch.float32) for t in (feature, divisor, slope, intercept))
    knots, e = knots.detach().to(torch.float32).contiguous(), per_batch_row(e, q)
    check_piecewise(q, k, feature, divisor, knots, slope, intercept, e, causal)
    return _PiecewiseAttention.apply(q, k, v, feature, divisor, slope, intercept, knots, e, causal,
                                     q.shape[-1] ** -0.5)


def attend_contextual(q: Tensor, k: Tensor, v: Tensor, rows: Tensor) -> Tensor:
    """Causal attention with CoPE's bias: rows (B,H,Tq,P) read at the contextual position p_ij = sum_{t=j..i}
    sigmoid(q_i . k_t / sqrt(Dh)), interpolated, clamped to P - 1 -> (B,H,Tq,Dh). Only where can_run(q, k, v); any
    other shape is refused before the kernel runs."""
    check_operands(q, k, v, True)
    rows = rows if rows.dtype == torch.float32 else rows.to(torch.float32)
    check_contextual(rows, q)
    if not _autograd(q, k, v, rows):
        return _contextual_forward(q, k, v, rows, q.shape[-1] ** -0.5)[0]
    return _ContextualAttention.apply(q, k, v, rows, q.shape[-1] ** -0.5)


__all__ = ["attend_contextual", "attend_piecewise", "attend_rows", "attend_table", "blocks", "can_run", "per_batch",
           "per_batch_row"]
