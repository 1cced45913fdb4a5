"""Attention with a piecewise-linear bias (Scheme.piecewise_bias: FIRE) on the GPU, forward and backward, through
the Triton kernels in piecewise_kernels.py; the bias is evaluated per tile from positions, no (B, H, Tq, Tk)
tensor exists, in training either.

    bias(b, h, i, j) = slopes[h, s] x + intercepts[h, s],  x = feature[e[b] - i + j] / divisor[b, i],
    s = the number of knots below x

the form the native CPU kernel reads (posenc.nn.fused_attention.attend_piecewise), with the same indexing as the
row kernel (attention.py): the feature must cover every key a query sees and must not grow with its index
(posenc.nn.row_paths builds it so); the divisor must be positive. Gradients reach q, k, v, the feature, the
divisor, the slopes and the intercepts, so FIRE's c, L and MLP weights train through them (relu_mlp_pieces and
the scheme's own formulas carry them on in autograd). A feature of one parameter theta (PiecewiseBias.feature_param,
FIRE's c) whose derivative d feature / d theta comes with it sends its gradient to theta instead: dQ's kernel sums
it per tile (pieces_dq_param), where the feature's own gradient takes diagonal sums and a reduction (pieces_dq_grad).
Every sum over pairs is written once per program and added up in a fixed order: no atomics, results repeat bit for
bit.

Tiles, warps and stages: attention.TILES (the "pieces_*" kernels), chosen by the static table
(benchmarks/gpu_static.py); launches go through attention.launch, which the static check replaces.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from posenc.nn.triton import attention, cdiv, next_power_of_2
from posenc.nn.triton import attention_kernels as row_kernels
from posenc.nn.triton import piecewise_kernels as kernels

KERNELS = ("pieces_forward", "pieces_dkdv", "pieces_dq", "pieces_dq_grad", "pieces_dq_param")
MAX_FAST_CROSSINGS = 1  # knots a tile of the kernels' FAST loops may cross (a static, predicated step each)


def _padded_feature(feature: Tensor, pad: int) -> Tensor:
    """(S,) -> (S + 2 pad,) padded with the end values: every index a tile forms lies inside, and the padded
    feature still does not grow with its index (the segment table's bounds hold)."""
    return torch.cat((feature[:1].expand(pad), feature, feature[-1:].expand(pad)))


def _inverse_bounds(inv: Tensor, bm: int) -> Tensor:
    """(B|1,Tq) -> (B|1, ceil(Tq / bm), 2): the smallest and largest inv of each block of bm queries."""
    tq = inv.shape[1]
    blocks = cdiv(tq, bm)
    padded = torch.cat((inv, inv[:, -1:].expand(-1, blocks * bm - tq)), 1).view(inv.shape[0], blocks, bm)
    return torch.stack((padded.amin(-1), padded.amax(-1)), -1)


def _segment_table(padded: Tensor, pad: int, e: Tensor, inv: Tensor, knots: Tensor, t: attention.Tiles, tq: int,
                   tk: int, keys_outer: bool) -> tuple[Tensor, Tensor]:
    """(B, NQ, NK, 2) int32: the segment range [s_lo, s_hi] of every tile of BM queries and BN keys, and where a
    kernel's loop may run FAST (at most MAX_FAST_CROSSINGS knots per tile): (B, NQ) the first key tile that
    crosses more, or (keys_outer: dK/dV's loop over queries) (B, NK) one past the last query tile that does.
    x = f inv lies between the tile's corner features times its queries' inv extremes (the feature does not grow
    with r = e - i + j; inv > 0), products the kernel's own rounding cannot leave."""
    nq, nk = cdiv(tq, t.bm), cdiv(tk, t.bn)
    m0 = torch.arange(nq, device=e.device)[None, :, None] * t.bm
    n0 = torch.arange(nk, device=e.device)[None, None, :] * t.bn
    r = e[:, None, None] - m0 + n0  # (B,NQ,NK): r at the tile's first query and key
    f_high, f_low = (padded[(x + pad).clamp(0, padded.shape[0] - 1)] for x in (r - (t.bm - 1), r + t.bn - 1))
    bounds = _inverse_bounds(inv, t.bm)  # (B|1,NQ,2)
    lo, hi = bounds[..., :1], bounds[..., 1:]
    x_lo = torch.minimum(f_low * lo, f_low * hi).contiguous()
    x_hi = torch.maximum(f_high * lo, f_high * hi).contiguous()
    s_lo, s_hi = torch.searchsorted(knots, x_lo), torch.searchsorted(knots, x_hi)  # knots below x
    heavy = s_hi - s_lo > MAX_FAST_CROSSINGS
    if keys_outer:
        split = torch.where(heavy, torch.arange(1, nq + 1, device=e.device)[:, None], 0).amax(1)
    else:
        split = torch.where(heavy, torch.arange(nk, device=e.device), nk).amin(2)
    return torch.stack((s_lo, s_hi), -1).to(torch.int32).contiguous(), split.to(torch.int32).contiguous()


def _batch_stride(t: Tensor) -> int:
    return t.stride(0) if t.shape[0] > 1 else 0


@dataclasses.dataclass
class KernelPieces:
    """A PiecewiseBias as the kernels read it, for one batch, head dim and dtype, without autograd (the kernels'
    backward turns their gradients into the pieces' own): every layer of a forward shares it (FIRE is one module
    for all layers), so posenc.nn.row_paths builds it once per forward, and each kernel's segment table is made
    once, on its first use, not in every layer's forward and backward."""

    inv: Tensor  # (B|1,Tq) float32, 1 / divisor
    slopes: Tensor  # (H,K+1) float32 in base-2 units (times log2 e)
    intercepts: Tensor  # (H,K+1)
    padded: Tensor  # (S + 2 pad,) the feature in float32, padded with its end values
    derivative: Tensor | None  # (S + 2 pad,) d feature / d feature_param likewise, where the pieces give it
    knots: Tensor  # (K,) float32, ascending
    extended: Tensor  # (K+1,) the knots, then +inf: "no knot"
    e: Tensor  # (B,) int64: r at query 0, key 0 of each batch row
    pad: int
    tile_sets: dict  # kernel name -> attention.Tiles
    tables: dict  # (kernel name, Tq, Tk) -> its segment table and split, (B,NQ,NK,2) and (B,NQ|NK) int32

    def table(self, name: str, tq: int, tk: int, keys_outer: bool) -> tuple[Tensor, Tensor]:
        """_segment_table at the kernel's tiles (made once: it depends on nothing a layer changes)."""
        made = self.tables.get((name, tq, tk))
        if made is None:
            made = self.tables[name, tq, tk] = _segment_table(self.padded, self.pad, self.e, self.inv, self.knots,
                                                              self.tile_sets[name], tq, tk, keys_outer)
        return made


@torch.no_grad()
def kernel_pieces(feature: Tensor, divisor: Tensor, knots: Tensor, slopes: Tensor, intercepts: Tensor, e: Tensor,
                  shape: tuple[int, int, int, int], device: torch.device, dtype: torch.dtype,
                  derivative: Tensor | None = None) -> KernelPieces:
    """The pieces (attend_pieces' arguments) for q of shape (B,H,Tq,Dh) on device in dtype: checked, in float32,
    the lines in base-2 units, the feature (and derivative, (S,) d feature / d feature_param) padded for every tile
    the kernels form."""
    b, h, tq, d = shape
    if feature.dim() != 1 or feature.shape[0] < 1:
        raise ValueError(f"piecewise feature {tuple(feature.shape)}: expected (S,) with S >= 1")
    if derivative is not None and derivative.shape != feature.shape:
        raise ValueError(f"piecewise feature derivative {tuple(derivative.shape)}: expected the feature's shape "
                         f"{tuple(feature.shape)}")
    if divisor.dim() != 2 or divisor.shape[0] not in (1, b) or divisor.shape[1] != tq:
        raise ValueError(f"piecewise divisor {tuple(divisor.shape)}: expected (B|1, Tq) = ({b}|1, {tq})")
    if knots.dim() != 1 or slopes.shape != (h, knots.shape[0] + 1) or intercepts.shape != slopes.shape:
        raise ValueError(f"piecewise slopes {tuple(slopes.shape)}, intercepts {tuple(intercepts.shape)}, knots "
                         f"{tuple(knots.shape)}: expected (H, K+1), (H, K+1), (K,) with H={h}")
    if e.dim() != 1 or e.shape[0] not in (1, b):
        raise ValueError(f"row offsets e {tuple(e.shape)}: expected (1,) or ({b},), one per batch row")
    tile_sets = {name: attention.tiles(name, d, device, dtype) for name in KERNELS}
    pad = attention._pad(*tile_sets.values())
    knots = knots.float().contiguous()
    extended = torch.cat((knots, knots.new_full((1,), float("inf"))))
    slopes, intercepts = (t.float().contiguous() * row_kernels.LOG2E for t in (slopes, intercepts))
    return KernelPieces((1.0 / divisor.float()).contiguous(), slopes, intercepts,
                        _padded_feature(feature.float(), pad),
                        None if derivative is None else _padded_feature(derivative.float(), pad), knots, extended,
                        e.to(device=device, dtype=torch.int64).expand(b).contiguous(), pad, tile_sets, {})


class _PiecewiseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, feature: Tensor, divisor: Tensor, slopes: Tensor,
                intercepts: Tensor, feature_param: Tensor | None, pieces: KernelPieces, causal: bool) -> Tensor:
        """feature (S,), divisor (B|1,Tq), slopes, intercepts (H,K+1), feature_param (the feature's one parameter,
        or None): the pieces whose gradients the backward gives (autograd sees them; the feature's goes to
        feature_param where one is given); the kernels read pieces, their float32, base-2 form."""
        q, k, v = attention._dense_last(q), attention._dense_last(k), attention._dense_last(v)
        attention._check_sizes(q, k, v)
        b, h, tq, d = q.shape
        padded, pad, e, extended = pieces.padded, pieces.pad, pieces.e, pieces.extended
        inv, slopes, intercepts = pieces.inv, pieces.slopes, pieces.intercepts
        t = pieces.tile_sets["pieces_forward"]
        segs, split = pieces.table("pieces_forward", tq, k.shape[2], keys_outer=False)
        # Trained pieces in 16 bits: the output stays in float32 for the backward's rowsum(dO * O). Rounded, it
        # leaves sum_j dS = 0 by ~2^-9 per query, and the slopes' and intercepts' gradients add dS over whole
        # segments, where that error adds up (6x the materialised bf16 path's error on FIRE's MLP, measured).
        exact_out = q.dtype != torch.float32 and any(ctx.needs_input_grad[3:8])
        out = torch.empty(q.shape, device=q.device, dtype=torch.float32 if exact_out else q.dtype)  # (B,H,Tq,Dh)
        lse = torch.empty(b, h, tq, device=q.device, dtype=torch.float32)  # base 2
        attention.launch(kernels._forward, (cdiv(tq, t.bm), h, b),
                         q, k, v, out, lse, padded[pad:], e, inv, segs, split, extended, slopes, intercepts,
                         *attention._bhd(q), *attention._bhd(k), *attention._bhd(v), *attention._bhd(out),
                         h, h // k.shape[1], tq, k.shape[2], _batch_stride(inv), segs.shape[1], segs.shape[2],
                         pieces.knots.shape[0], d**-0.5 * row_kernels.LOG2E, D=d, CAUSAL=causal, BM=t.bm, BN=t.bn,
                         BD=attention.padded_head_dim(d), **attention._options(t, q.dtype, q.device))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.pieces, ctx.feature_len = causal, pieces, feature.shape[0]
        ctx.by_parameter, ctx.param_shape = feature_param is not None, getattr(feature_param, "shape", None)
        return out if out.dtype == q.dtype else out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        pieces = ctx.pieces
        padded, pad, e, extended = pieces.padded, pieces.pad, pieces.e, pieces.extended
        inv, slopes, intercepts = pieces.inv, pieces.slopes, pieces.intercepts
        dout, delta = attention.output_gradient_and_delta(attention._dense_last(dout), out)  # delta (B,H,Tq)
        b, h, tq, d = q.shape
        hkv, tk = k.shape[1], k.shape[2]
        group, n_knots = h // hkv, pieces.knots.shape[0]
        strides = (*attention._bhd(q), *attention._bhd(k), *attention._bhd(v), *attention._bhd(dout))
        scales = (d**-0.5 * row_kernels.LOG2E, d**-0.5)
        shape = dict(D=d, CAUSAL=ctx.causal, BD=attention.padded_head_dim(d))
        kv_dtype = k.dtype if group == 1 else torch.float32  # GQA: each query head's, added up after
        dk_heads = torch.empty(b, h, tk, d, device=q.device, dtype=kv_dtype)
        dv_heads = torch.empty(b, h, tk, d, device=q.device, dtype=kv_dtype)
        t = pieces.tile_sets["pieces_dkdv"]
        segs, split = pieces.table("pieces_dkdv", tq, tk, keys_outer=True)
        attention.launch(kernels._dkdv, (cdiv(tk, t.bn), h, b), q, k, v, dout, lse, delta, dk_heads, dv_heads,
                         padded[pad:], e, inv, segs, split, extended, slopes, intercepts, *strides, h, group, tq, tk,
                         _batch_stride(inv), segs.shape[1], segs.shape[2], n_knots, *scales, BM=t.bm, BN=t.bn,
                         **shape, **attention._options(t, q.dtype, q.device))
        dk, dv = dk_heads, dv_heads
        if group > 1:
            dk = dk_heads.view(b, hkv, group, tk, d).sum(2).to(k.dtype)
            dv = dv_heads.view(b, hkv, group, tk, d).sum(2).to(v.dtype)
        param_grad = any(ctx.needs_input_grad[3:8])
        by_parameter = param_grad and ctx.by_parameter
        name = "pieces_dq_param" if by_parameter else "pieces_dq_grad" if param_grad else "pieces_dq"
        t = pieces.tile_sets[name]
        segs, split = pieces.table(name, tq, tk, keys_outer=False)
        q_blocks, diag_len = cdiv(tq, t.bm), (cdiv(tk, t.bn) * t.bn + t.bn if param_grad and not by_parameter else 1)
        segments = next_power_of_2(n_knots + 1)
        # by parameter: one sum per program, each written (the diagonal sums leave entries no program writes)
        diag = (torch.empty if by_parameter else torch.zeros)(b * h, q_blocks, diag_len, device=q.device,
                                                              dtype=torch.float32)
        d_inv = torch.empty(b, h, tq, device=q.device, dtype=torch.float32) if param_grad else diag
        sums = torch.empty(b, h, q_blocks, 2 * segments if param_grad else 1, device=q.device, dtype=torch.float32)
        dq = torch.empty(b, h, tq, d, device=q.device, dtype=q.dtype)
        derivative = pieces.derivative if by_parameter else padded
        attention.launch(kernels._dq, (q_blocks, h, b), q, k, v, dout, lse, delta, dq, padded[pad:], derivative[pad:],
                         e, inv, segs, split, extended, slopes, intercepts, diag, d_inv, sums, *strides, h, group, tq,
                         tk, _batch_stride(inv), segs.shape[1], segs.shape[2], n_knots, diag_len, *scales,
                         PARAM_GRAD=param_grad, BY_PARAMETER=by_parameter, BM=t.bm, BN=t.bn, SEGMENTS=segments,
                         **shape, **attention._options(t, q.dtype, q.device))
        if not param_grad:
            return dq, dk, dv, None, None, None, None, None, None, None
        # The kernels' sums are of dS, the gradient of the bias in base-2 units (times log2 e): the feature's and the
        # divisor's take ln 2; the slopes' and intercepts' none, as the kernels read them times log2 e.
        ln2 = 1.0 / row_kernels.LOG2E
        d_feature = d_param = None
        if by_parameter:
            d_param = diag.sum().mul_(ln2).reshape(ctx.param_shape)  # programs added in a fixed order
        else:
            d_feature = torch.empty(h, ctx.feature_len, device=q.device, dtype=torch.float32)
            attention.launch(row_kernels._row_reduce, (h, cdiv(ctx.feature_len, attention.REDUCE_BLOCK)), diag, e,
                             d_feature, b, h, q_blocks, diag_len, ctx.feature_len, BM=t.bm, BR=attention.REDUCE_BLOCK)
            d_feature = d_feature.sum(0).mul_(ln2)
        d_inv = d_inv.sum(1) if inv.shape[0] > 1 else d_inv.sum((0, 1))[None]  # (B|1,Tq)
        d_divisor = d_inv.mul_(inv.square()).mul_(-ln2)  # inv = 1 / divisor: d inv / d divisor = -inv^2
        sums = sums.view(b, h, q_blocks, 2, segments).sum((0, 2))[..., : n_knots + 1]  # (H,2,K+1)
        return dq, dk, dv, d_feature, d_divisor, sums[:, 1], sums[:, 0], d_param, None, None


def attend_kernel_pieces(q: Tensor, k: Tensor, v: Tensor, feature: Tensor, divisor: Tensor, slopes: Tensor,
                         intercepts: Tensor, pieces: KernelPieces, causal: bool,
                         feature_param: Tensor | None = None) -> Tensor:
    """q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh) in bf16, fp16 or fp32 (one dtype); feature, divisor, slopes, intercepts as
    attend_pieces takes them, pieces = kernel_pieces of them for q's shape, device and dtype -> (B,H,Tq,Dh) in q's
    dtype, accumulated in float32. Causal needs Tq <= Tk. feature_param: the one parameter the feature reads (a
    scalar tensor; pieces must hold d feature / d feature_param): the feature's gradient goes to it, none to the
    feature."""
    attention.check_qkv(q, k, v, causal)
    if feature_param is not None:
        if pieces.derivative is None or feature_param.numel() != 1:
            raise ValueError(f"feature_param {tuple(feature_param.shape)}: expected one value, with the feature's "
                             "derivative in the kernel pieces (kernel_pieces(..., derivative=...))")
        feature = feature.detach()
    return _PiecewiseAttention.apply(q, k, v, feature, divisor, slopes, intercepts, feature_param, pieces, causal)


def attend_pieces(q: Tensor, k: Tensor, v: Tensor, feature: Tensor, divisor: Tensor, knots: Tensor, slopes: Tensor,
                  intercepts: Tensor, e: Tensor, causal: bool, feature_param: Tensor | None = None,
                  derivative: Tensor | None = None) -> Tensor:
    """q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh) in bf16, fp16 or fp32 (one dtype), feature (S,) not growing with its
    index, divisor (B|1,Tq) positive, knots (K,) ascending, slopes/intercepts (H,K+1), e (B|1,) -> (B,H,Tq,Dh) in
    q's dtype, accumulated in float32. Causal needs Tq <= Tk (queries are the last keys). feature_param and
    derivative (S,) = d feature / d feature_param: the feature's gradient goes to feature_param
    (attend_kernel_pieces)."""
    attention.check_qkv(q, k, v, causal)  # before the pieces are built
    pieces = kernel_pieces(feature, divisor, knots, slopes, intercepts, e, tuple(q.shape), q.device, q.dtype,
                           derivative)
    return attend_kernel_pieces(q, k, v, feature, divisor, slopes, intercepts, pieces, causal, feature_param)


__all__ = ["KERNELS", "KernelPieces", "attend_kernel_pieces", "attend_pieces", "kernel_pieces"]
