"""The shapes and dtypes each native CPU kernel (posenc/nn/csrc) reads, checked in Python before the call.

The kernels get raw pointers and trust the sizes they are told: a row table with more heads than q, a RoPE table
wider than the head, or a feature shorter than the distances read would make them read or write memory they do
not own (an abort, or silently different outputs). So every entry (posenc.nn.fused_attention's attend_*,
posenc.rotary._fast.rotate_native) calls one of these first; each raises a one-line ValueError (a ConfigError)
naming both shapes. Notation as in attention.py.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.errors import bad_value


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _float32_cpu(name: str, t: Tensor) -> None:
    if t.dtype != torch.float32 or t.device.type != "cpu":
        raise bad_value(f"{name} dtype", f"{t.dtype} on {t.device}", "float32 on the CPU (the native kernels' type)")


def check_operands(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> None:
    """q (B,H,Tq,Dh), k and v (B,Hkv,Tk,Dh), H a multiple of Hkv, float32 on the CPU; causal: Tq <= Tk."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _float32_cpu(name, t)
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise bad_value("q, k, v shapes", (_shape(q), _shape(k), _shape(v)),
                        "q (B, H, Tq, Dh) and k, v (B, Hkv, Tk, Dh) of one shape")
    b, h, tq, d = q.shape
    if k.shape[0] != b or k.shape[1] < 1 or h % k.shape[1] or k.shape[-1] != d:
        raise bad_value("k shape", _shape(k), f"(B={b}, a divisor of H={h}, Tk, Dh={d}) for q of shape {_shape(q)}")
    if causal and tq > k.shape[2]:
        raise bad_value("q length", tq, f"at most Tk={k.shape[2]} when causal (q {_shape(q)}, k {_shape(k)})")


def check_rows(rows: Tensor, q: Tensor, e: Tensor) -> None:
    """rows (B|1, H|1, Tq|1, S >= 1) float32, e (B,) int64 (the kernel clamps the index into the row)."""
    _float32_cpu("rows", rows)
    b, h, tq, _ = q.shape
    shape = _shape(rows)
    if len(shape) != 4 or shape[0] not in (1, b) or shape[1] not in (1, h) or shape[2] not in (1, tq) or shape[3] < 1:
        raise bad_value("bias rows shape", shape, f"(B|1, H|1, Tq|1, S >= 1) = ({b}|1, {h}|1, {tq}|1, S) "
                        f"for q of shape {_shape(q)}")
    _check_offsets(e, b)


def check_table(table: Tensor, values: Tensor | None, row_shift: Tensor | None, q_shift: Tensor | None, q: Tensor,
                e: Tensor) -> None:
    """table (H|1, S >= 1, Dh) with rows of Dh contiguous; values (S, Dh), row_shift and q_shift (H, Dh) or None,
    contiguous; all float32; e (B,) int64."""
    _float32_cpu("relative table", table)
    b, h, _, d = q.shape
    if table.dim() != 3 or table.shape[0] not in (1, h) or table.shape[1] < 1 or table.shape[2] != d:
        raise bad_value("relative table shape", _shape(table), f"(H|1, S >= 1, Dh) = ({h}|1, S, {d}) for q of shape "
                        f"{_shape(q)}")
    if table.stride(2) != 1 or (table.shape[1] > 1 and table.stride(1) != d):
        raise bad_value("relative table layout", table.stride(), f"rows of Dh = {d} contiguous (strides (*, {d}, 1))")
    for name, t, shape in (("relative values", values, (table.shape[1], d)), ("row shift", row_shift, (h, d)),
                           ("q shift", q_shift, (h, d))):
        if t is None:
            continue
        _float32_cpu(name, t)
        if tuple(t.shape) != shape:
            raise bad_value(f"{name} shape", _shape(t), f"{shape}")
        if not t.is_contiguous():
            raise bad_value(f"{name} layout", t.stride(), "contiguous")
    _check_offsets(e, b)


def check_piecewise(q: Tensor, k: Tensor, feature: Tensor, divisor: Tensor, knots: Tensor, slope: Tensor,
                    intercept: Tensor, e: Tensor, causal: bool) -> None:
    """feature (S,), divisor (B|1,Tq), knots (K,), slope and intercept (H,K+1), all float32; e (B,) int64 with
    every index e[b] - i + j that attention reads inside the feature (the kernel does not clamp it)."""
    for name, t in (("feature", feature), ("divisor", divisor), ("knots", knots), ("slope", slope),
                    ("intercept", intercept)):
        _float32_cpu(name, t)
    b, h, tq, _ = q.shape
    if knots.dim() != 1 or slope.shape != (h, knots.shape[0] + 1) or intercept.shape != slope.shape:
        raise bad_value("piecewise slope, intercept, knots shapes", (_shape(slope), _shape(intercept), _shape(knots)),
                        f"(H, K+1), (H, K+1), (K,) with H={h} for q of shape {_shape(q)}")
    if divisor.dim() != 2 or divisor.shape[0] not in (1, b) or divisor.shape[1] != tq:
        raise bad_value("piecewise divisor shape", _shape(divisor), f"(B|1, Tq) = ({b}|1, {tq}) for q {_shape(q)}")
    _check_offsets(e, b)
    if feature.dim() != 1:
        raise bad_value("piecewise feature shape", _shape(feature), "(S,): one value per distance")
    if b == 0 or tq == 0:  # nothing is read
        return
    tk = k.shape[2]
    lowest, highest = int(e.min()) - (tq - 1), int(e.max()) + (tk - tq if causal else tk - 1)
    if lowest < 0 or highest >= feature.shape[0]:
        raise bad_value("piecewise feature length", feature.shape[0],
                        f"more than {highest} with offsets e from {int(e.min())} to {int(e.max())} (indices "
                        f"{lowest}..{highest} read for q {_shape(q)}, k {_shape(k)}), and no index below 0")


def check_contextual(rows: Tensor, q: Tensor) -> None:
    """CoPE's rows (B, H, Tq, P >= 1) float32, one per query (the kernel indexes them densely)."""
    _float32_cpu("CoPE rows", rows)
    b, h, tq, _ = q.shape
    if rows.dim() != 4 or rows.shape[:3] != q.shape[:3] or rows.shape[3] < 1:
        raise bad_value("CoPE rows shape", _shape(rows), f"(B, H, Tq, P >= 1) = ({b}, {h}, {tq}, P) "
                        f"for q of shape {_shape(q)}")


def check_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> None:
    """cos and sin of one shape (..., R/2) with R <= Dh: the tables rotate at most the head's own dims."""
    if cos.shape != sin.shape or cos.dim() < 1 or x.dim() < 1 or 2 * cos.shape[-1] > x.shape[-1]:
        raise bad_value("rotary table shapes", (_shape(cos), _shape(sin)),
                        f"cos and sin of one shape (..., R/2) with R <= the head dim {x.shape[-1] if x.dim() else 0} "
                        f"of x {_shape(x)}")


def _check_offsets(e: Tensor, b: int) -> None:
    if e.dtype != torch.int64 or e.dim() != 1 or e.shape[0] != b or not e.is_contiguous():
        raise bad_value("row offsets e", f"{_shape(e)} {e.dtype}", f"({b},) int64, one per batch row, contiguous")


__all__ = ["check_contextual", "check_operands", "check_piecewise", "check_rotary", "check_rows", "check_table"]
