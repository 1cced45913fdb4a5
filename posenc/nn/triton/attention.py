"""Attention with a bias of one row per head (Scheme.bias_by_distance: ALiBi, KERPLE, Sandwich, T5) on the GPU,
forward and backward, through the Triton kernels in attention_kernels.py; no (B, H, Tq, Tk) tensor exists.

    bias(b, h, i, j) = rows[h, e[b] - i + j]        rows (H, S) float32, e (B,) int64

the same indexing as posenc.nn.fused_attention's rows (its CPU twin), for rows shared by every query. The rows
must cover every key a query sees (0 <= e[b] - i + j < S wherever the mask allows): posenc.nn.row_paths builds
them over exactly the span attention reads. Gradients reach q, k, v and the rows, so a scheme's parameters
(T5's bucket table; KERPLE's b, a, p in float32: in 16-bit types head_bias.py sums theirs per tile) train through
them. The row gradient is summed per tile along its diagonals into a buffer of (B, H, Tq / BM, Tk + BN) floats and
reduced in a fixed order: no atomics, so it repeats bit for bit (the buffer is about 4 Tq Tk / BM bytes per (b, h):
200 MB at Tq = Tk = 16k, H = 12, BM = 64).

Tiles, warps and stages per kernel and head dim: TILES, justified by the static table (benchmarks/gpu_static.py:
registers, spills, shared memory and instructions per tile, compiled for sm_90 without a GPU). Every launch goes
through launch(), which the static check replaces to compile exactly what this module would run.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.inference_tensors import DerivedPerTensor, ordinary
from posenc.nn.fused_attention import per_batch_row
from posenc.nn.triton import attention_kernels as kernels
from posenc.nn.triton import cdiv, next_power_of_2

ROW_KERNELS = ("forward", "dkdv", "dq", "dq_rows", "dq_head_params", "dq_buckets")  # whose tiles read the padded rows
REDUCE_BLOCK = 256  # row elements per program of the row-gradient reduction
GRID_AXIS_LIMIT = 65_535  # CUDA's limit on grid axes 1 and 2 (heads, batch)
INT32_LIMIT = 2**31


class Tiles(NamedTuple):
    bm: int  # queries per tile
    bn: int  # keys per tile
    warps: int
    stages: int


# Rows per query (relative.py, relative_kernels.py; BM <= BN): each tile also holds qr, two chunks of qr . R and
# the gathers that read them per pair, so the tiles are smaller than the row kernel's. Sweeps at bf16, causal,
# Shaw / Transformer-XL (registers / spilled bytes):
#   Dh 64: forward 64x64 8 warps 255/352 and 255/112; 32x64 8 warps 255/80 and 238/0; 32x32 4 warps 255/8 (with
#          the far loop) and 228/0; 32x32 8 warps: see the static table
#          dq 32x64 8 warps 255/56 and 255/32; 32x32 4 warps 255/96 and 255/0; 16x32 4 warps 251/0 and 236/0
#          dkdv 32x64 8 warps 255/32 and 249/0; 16x64 4 warps 255/32; 32x32 4 warps 246/0 and 224/0
#   Dh 128: forward 32x32 8 warps 191/0 and 170/0 (4 warps: 255/40); dq 16x32 8 warps 252/0 and 246/0; dkdv
#          32x32 8 warps 255/8 (Shaw); 16x32 8 warps 194/0 and 164/0
#   Dh 256: the smallest tiles (16x16, 8 warps) spill 16-112 B in Shaw's dQ and dK/dV: not served (no entry).
#   (the far loop of those sweeps left the programs since: Shaw's far tiles run at the row kernel's forward, dkdv and
#   dq tiles below, relative_far_kernels.py, whose blocks must hold whole blocks of these.)
#   float32 (TF32): Dh 64 forward 16x32 4 warps 197/0; dq and dkdv 16x32 8 warps 255/0 and 226/0; Dh 128: dq and
#          dkdv spill 200-248 B: not served.
# Since the bias enters q . k's product as its accumulator and each skew is one gather (relative_kernels.py), at bf16
# Dh 64, registers / spilled bytes / loop instructions, and instructions per pair of keys and warp (row kernel's
# forward 0.35): Transformer-XL forward 64x64 4 warps 1 stage 255/0/736 (0.72; its gather index kept in the loop,
# relative_kernels._opaque_zero; 8 warps 1.10: the products' M = 64 idles half of them; 32x32 2.19; Dh 16 and 32:
# 0.59, 0.63), dkdv 32x32 4 warps 223/0/334 (1.31), dq 32x32 4 warps 1 stage 246/0/450 (1.76: a table over every
# distance flushed without reductions, _add_rows; 16x32 4.00 before that; _opaque_zero does not help here); Shaw (the
# value table: more registers) forward 32x32 4 warps 255/0/496 (1.94; 64x64 spills 168-448 B), dkdv 32x32 4 warps
# 255/0/466, dq 16x32 4 warps 255/0/879 (32x32: 248 B). Dh 128: Transformer-XL forward 32x32 8 warps 182/0/375 (64x64
# 8 warps: 176 B; 4 warps: 296 B), dkdv 32x32 8 warps 186/0/398, dq 32x32 8 warps 1 stage 246/0/473; Shaw forward
# 32x32 8 warps 254/0/491 (4 warps: 64 B), dkdv 16x32 8 warps 219/0/417 (32x32: 24 B), dq 16x32 8 warps 254/0/874
# (32x32: 248 B). TF32 Dh 64, Transformer-XL: forward 32x32 4 warps 226/0/450 (1.76 against 16x32's 2.61), dq 32x32 8
# warps 234/0/630; Shaw forward 32x32 4 warps 255/0/724 (16x32 4 warps: 8 B spilled). Shaw's kernels are keyed
# relative_values_*. Dh 32 (and TF32 Dh 16), where dQ spilled before these changes too (Shaw 128 B at bf16, 216 B at
# TF32 Dh 32): Shaw dK/dV 32x32 8 warps 255/0, Shaw dQ 16x32 8 warps 40 B (TF32: 176 B at Dh 32, 24 B at 16),
# Transformer-XL dQ 16x32 4 warps 255/0 (TF32: 8 B, as before).
# Transformer-XL at Dh 128 ran 32x32 tiles on 8 warps: mma.sync (wgmma needs 64 rows per warpgroup) and 128 pairs
# per warp, 4x Dh 64's instructions per pair. Since (relative_kernels.py): a forward query block two key tiles tall
# (BM = 2 BN: three chunks carried), distances in int32, and each tile's addresses formed from the head's base in
# the loop (pointer tensors carried from outside held 64-bit offsets across both loops: 48 B spilled at 64x32); dK/dV
# with a lower chunk BM wide where BM <= BN / 4 (_rotated_narrow). Sweeps at bf16, causal (registers / spilled bytes
# / instructions per pair and warp): Dh 128 forward 64x32 4 warps 244/0/0.94 (2.96 before; 64x64 4 warps 104 B,
# 128x64 8 warps 248 B, 32x32 4 warps 1.68), dkdv 16x128 8 warps 2 stages 252/0/1.88 (3.11 before; 32x128 8 B,
# 32x32 4 warps 1.93), dq 32x32 8 warps 234/0/3.13 (3.70 before; 4 warps 80 B, 64x32: 424-704 B: two (BM,Dh)
# accumulators, dQc and dQr); Dh 64 forward 64x64 4 warps 0.67, dkdv 32x64 4 warps 1 stage 254/0/0.85, dq 32x32 4
# warps 1.48; Dh 16 and 32 the same shapes (0.58-0.62, 0.65-0.70, 1.29-1.50). TF32: Dh 64 forward 64x32 4 warps
# 211/0/1.05 (1.84 before), dkdv 32x32 4 warps 1 stage 2.04 (5.27), dq 16x32 4 warps 3.41 (3.95); Dh 16 and 32
# forward 64x64 4 warps 0.76-0.82, dkdv 32x64 4 warps 0.90-1.05, dq 32x32 4 warps 1.79 (16) and 16x64 8 warps 2.58
# (32; 32x32: 80 B). Shaw's kernels share the code: where its old tiles spilled after it (8 B in dK/dV at bf16 Dh 32
# and TF32 Dh 32), bf16 Dh 32 dK/dV 32x32 4 warps (0 B, 1.96 against 3.79), TF32 Dh 32 16x32 8 warps 2 stages (0 B);
# its dQ, which spilled before at Dh 32 and TF32 16 (24-184 B), bf16 Dh 32 16x32 8 warps 1 stage (16-24 B against
# 24-40 B), TF32 Dh 16 2 stages (0 B against 24 B); TF32 Dh 32 dQ spills 208-224 B (176-184 B before; every tile of
# the sweep 192-368 B).
RELATIVE_BY_HEAD_DIM = {
    "relative_forward": {16: Tiles(64, 64, 4, 1), 32: Tiles(64, 64, 4, 1), 64: Tiles(64, 64, 4, 1),
                         128: Tiles(64, 32, 4, 1)},
    "relative_dkdv": {16: Tiles(32, 64, 4, 1), 32: Tiles(32, 64, 4, 1), 64: Tiles(32, 64, 4, 1),
                      128: Tiles(16, 128, 8, 2)},
    "relative_dq": {16: Tiles(32, 32, 4, 1), 32: Tiles(32, 32, 4, 1), 64: Tiles(32, 32, 4, 1),
                    128: Tiles(32, 32, 8, 1)},
    "relative_values_forward": {16: Tiles(32, 32, 4, 2), 32: Tiles(32, 32, 4, 2), 64: Tiles(32, 32, 4, 2),
                                128: Tiles(32, 32, 8, 2)},
    "relative_values_dkdv": {16: Tiles(32, 32, 4, 2), 32: Tiles(32, 32, 4, 2), 64: Tiles(32, 32, 4, 2),
                             128: Tiles(16, 32, 8, 2)},
    "relative_values_dq": {16: Tiles(16, 32, 4, 2), 32: Tiles(16, 32, 8, 1), 64: Tiles(16, 32, 4, 2),
                           128: Tiles(16, 32, 8, 2)},
}
RELATIVE_FP32_BY_HEAD_DIM = {
    "relative_forward": {16: Tiles(64, 64, 4, 1), 32: Tiles(64, 64, 4, 1), 64: Tiles(64, 32, 4, 1)},
    "relative_dkdv": {16: Tiles(32, 64, 4, 1), 32: Tiles(32, 64, 4, 2), 64: Tiles(32, 32, 4, 1)},
    "relative_dq": {16: Tiles(32, 32, 4, 1), 32: Tiles(16, 64, 8, 1), 64: Tiles(16, 32, 4, 1)},
    "relative_values_forward": dict.fromkeys((16, 32, 64), Tiles(32, 32, 4, 1)),
    "relative_values_dkdv": {16: Tiles(16, 32, 8, 1), 32: Tiles(16, 32, 8, 2), 64: Tiles(16, 32, 8, 1)},
    "relative_values_dq": {16: Tiles(16, 32, 8, 2), 32: Tiles(16, 32, 8, 2), 64: Tiles(16, 32, 8, 1)},
}
# (kernel, padded head dim) -> Tiles on a GPU, chosen by the static table (benchmarks/gpu_static.py, BENCHMARKS-gpu.md):
# the largest tiles that spill no register in bf16/fp16 and fit the H100's 227 KB of shared memory per block, the
# shapes of Triton's fused-attention tutorial (dK/dV over a few queries x 128 keys, dQ over 128 queries x 32).
# dq_rows (dQ with the row gradient) needs BM <= BN for its diagonal sums. Sweeps at bf16, causal (registers /
# spilled bytes / loop instructions per tile):
#   forward 128x64 8 warps 3 stages: 176/0/355 at Dh 64, 255/0/411 at 128; 128x128: 1.4x the instructions per
#     pair of keys, 216-344 B spilled at 128; 4 warps: 488 B spilled at 128
#   dkdv 64x128 8 warps: 210/0/412 at 64 (24 B spilled at 128); 32x128 8 warps: 228/0/331 at 128; 64x64 4 warps
#     spills 336 B at 128
#   dq 128x32 8 warps: 128/0/197 and 206/0/238; dq_rows 32x32 8 warps: 128/0/196 and 175/0/267 (64x64: 136-320 B);
#     dq_rows 32x64 8 warps 228/0/326 and 232/0/415: 17% and 22% fewer instructions per pair than 32x32 (at Dh 16
#     and 32, 10% and 14%; 4 warps spilled 48-112 B), chosen after the H200 timed kerple's and T5's backward at 3x
#   Dh 256: forward 64x32, dkdv and dq 32x32, dq_rows 16x32, all without spills.
_BY_HEAD_DIM = {
    "forward": {16: Tiles(128, 64, 4, 3), 32: Tiles(128, 64, 4, 3), 64: Tiles(128, 64, 8, 3),
                128: Tiles(128, 64, 8, 3), 256: Tiles(64, 32, 8, 2)},
    "dkdv": {16: Tiles(64, 128, 8, 2), 32: Tiles(64, 128, 8, 2), 64: Tiles(64, 128, 8, 2),
             128: Tiles(32, 128, 8, 2), 256: Tiles(32, 32, 8, 2)},
    "dq": {16: Tiles(128, 32, 4, 2), 32: Tiles(128, 32, 4, 2), 64: Tiles(128, 32, 8, 2),
           128: Tiles(128, 32, 8, 2), 256: Tiles(32, 32, 8, 2)},
    "dq_rows": {16: Tiles(32, 64, 8, 2), 32: Tiles(32, 64, 8, 2), 64: Tiles(32, 64, 8, 2),
                128: Tiles(32, 64, 8, 2), 256: Tiles(16, 32, 8, 2)},
    # dQ with the per-head parameters' sums (head_bias_kernels.py). Sweeps at bf16, causal (registers / spilled bytes
    # / loop instructions, and per pair of keys and warp; dq_rows: 1.27 at Dh 64, 1.62 at 128, 4.22 at 256): 128x64 8
    # warps 255/0/568 (0.55) at 64, 255/0/626 (0.61) at 128, 190-202/0 (0.52-0.53) at 16-32; 128x32 8 warps 155/0/346
    # (0.68) and 254/0/395 (0.77); 64x64 8 warps 1.18 and 80 B; 128x32 4 warps 40 B at 32. Dh 256: 64x32 8 warps
    # 255/0/625 (2.44; 32x64 2.61). The sums as three (BM,BN) accumulators instead of one row each: 251/0/384 (0.75)
    # at 128x32, 400-1032 B spilled at 128x64 and 128x32 4 warps.
    "dq_head_params": {16: Tiles(128, 64, 8, 2), 32: Tiles(128, 64, 8, 2), 64: Tiles(128, 64, 8, 2),
                       128: Tiles(128, 64, 8, 2), 256: Tiles(64, 32, 8, 2)},
    # dQ with the bucket table's sums (bucket_bias_kernels.py: T5): any BM (the diagonal sums run in chunks of BN).
    # Sweeps at bf16, causal (registers / spilled bytes / loop instructions, then per pair of keys and warp on the
    # path of a tile of the running bucket, gpu_static.fallthrough_instructions; dq_rows 1.27 at Dh 64, 1.62 at 128,
    # 4.22 at 256): Dh 64 128x64 8 warps 2 stages 255/0/1010 (0.40; the diagonal chunks unrolled: 8 B spilled, 0.38),
    # 1 stage 56 B, 128x32 8 warps 208/0 (0.45), 64x64 8 warps 247/0 (0.75), 64x64 4 warps 64 B, 128x64 4 warps
    # 1192 B; Dh 128 128x32 8 warps 254/0/501 (0.51), 128x64 80 B, 64x64 40 B; Dh 16, 32 128x64 239/0 and 236/0
    # (0.34, 0.36); Dh 256 32x32 8 warps 170/0 (3.12; 64x32 96 B). A tile spanning several buckets runs the loop's
    # other branch, about 5x a one-bucket tile at 128x64 (2036 instructions against 407; three chunks of 513).
    "dq_buckets": {16: Tiles(128, 64, 8, 2), 32: Tiles(128, 64, 8, 2), 64: Tiles(128, 64, 8, 2),
                   128: Tiles(128, 32, 8, 2), 256: Tiles(32, 32, 8, 2)},
    **RELATIVE_BY_HEAD_DIM,
    # The piecewise bias (piecewise_attention.py: FIRE); pieces_dq_grad needs BM <= BN like dq_rows. Sweeps at
    # bf16, causal (registers / spilled bytes / hot-loop instructions, a knot crossing's branch included): forward
    # 128x64 8 warps 253/0/542 at Dh 64, 255/8 B at 128 (128x32: 243/0/401), 4 warps 208-312 B at 16-32; dkdv
    # 64x128 spilled 272 B at 64, 32x128 241/0/399 at 64, 200 B at 128 (32x32: 185/0/308); dq 128x32 220/0/301
    # and dq_grad 32x32 218/0/561 at 64.
    "pieces_forward": {16: Tiles(128, 64, 8, 3), 32: Tiles(128, 64, 8, 3), 64: Tiles(128, 64, 8, 3),
                       128: Tiles(128, 32, 8, 3), 256: Tiles(64, 32, 8, 2)},
    "pieces_dkdv": {16: Tiles(32, 128, 8, 2), 32: Tiles(32, 128, 8, 2), 64: Tiles(32, 128, 8, 2),
                    128: Tiles(32, 32, 8, 2), 256: Tiles(32, 32, 8, 2)},
    "pieces_dq": {16: Tiles(128, 32, 4, 2), 32: Tiles(128, 32, 4, 2), 64: Tiles(128, 32, 8, 2),
                  128: Tiles(128, 32, 8, 2), 256: Tiles(32, 32, 8, 2)},
    "pieces_dq_grad": {16: Tiles(32, 32, 4, 2), 32: Tiles(32, 32, 4, 2), 64: Tiles(32, 32, 8, 2),
                       128: Tiles(32, 32, 8, 2), 256: Tiles(16, 32, 8, 2)},
    # pieces_dq_param (the feature's one parameter summed per tile: no diagonal sums, so any BM) at bf16, causal
    # (registers / spilled bytes / loop instructions, and per pair of keys and warp; pieces_dq_grad: 4.38 at Dh 64,
    # 5.47 at 128): Dh 64 128x32 8 warps 223/0/657 (1.28), 64x32 4 warps 224/0/644 (1.26), 128x64 8 warps 232 B
    # spilled, 64x64 104 B; Dh 128 128x16 8 warps 254/0/497 (1.94), 128x32 8 warps 24 B (1 stage 40 B, 3 stages
    # 56 B), 32x64 8 warps 222/0/744 (2.91), 64x32 136-152 B; Dh 16, 32 128x32 8 warps 237/0 and 216/0 (1.23, 1.26;
    # 128x64 8-48 B); Dh 256 32x32 8 warps 232/0/833 (6.51; 64x16 584 B).
    "pieces_dq_param": {16: Tiles(128, 32, 8, 2), 32: Tiles(128, 32, 8, 2), 64: Tiles(128, 32, 8, 2),
                        128: Tiles(128, 16, 8, 2), 256: Tiles(32, 32, 8, 2)},
}
# float32 runs as TF32 (4-byte operands: half the tile of a 16-bit type for the same shared memory), and only up to
# Dh 128: at 256 every tile spilled 100-2800 B. Sweeps with TF32 (registers / spilled bytes): forward 128x32 8 warps
# 128/0 at Dh 64 and 239/0 at 128 (64x64: 32-256 B spilled); dkdv 32x64 8 warps 255/0 at 64, 32x32 8 warps 193/0 at
# 128 and 216/0 at 80 (4 warps: 16 B spilled at 80 and 96); dq 64x32 8 warps 161/0 and 255/0; dq_rows 32x32 4 warps
# 208/0 and 242/0.
_FP32_BY_HEAD_DIM = {
    "forward": dict.fromkeys((16, 32, 64, 128), Tiles(128, 32, 8, 2)),
    "dkdv": {16: Tiles(32, 64, 8, 2), 32: Tiles(32, 64, 8, 2), 64: Tiles(32, 64, 8, 2), 128: Tiles(32, 32, 8, 2)},
    "dq": dict.fromkeys((16, 32, 64, 128), Tiles(64, 32, 8, 2)),
    "dq_rows": dict.fromkeys((16, 32, 64, 128), Tiles(32, 32, 4, 2)),
    # dq_head_params with TF32 took more instructions per pair than dq_rows (32x32 4 warps: 1.86 against 1.41 at Dh
    # 64, 2.44 against 1.98 at 128; 64x32 8 warps 1.91 and 120 B spilled; 64x64 24-376 B), so the dispatch keeps
    # float32 on dq_rows; these tiles serve attend_head_bias called directly (tests).
    "dq_head_params": dict.fromkeys((16, 32, 64, 128), Tiles(32, 32, 4, 2)),
    # dq_buckets with TF32, one-bucket path per pair and warp (dq_rows: 1.41 at Dh 64, 1.98 at 128): 128x16 8 warps
    # 0.73 / 0.89 / 1.19 at Dh 16 / 64 / 128, 0/0 B spilled (32x32 4 warps 1.26 and 2.13; 64x16 4 warps 224 B). The
    # dispatch keeps float32 on dq_rows all the same (posenc.nn.dispatch); these serve attend_bucket_bias called
    # directly.
    "dq_buckets": dict.fromkeys((16, 32, 64, 128), Tiles(128, 16, 8, 2)),
    **RELATIVE_FP32_BY_HEAD_DIM,
    # FIRE's with TF32: dkdv 32x64 spilled 80 B at 64 (32x32: 186/0), dq 64x32 272 B at 128, dq_grad 32x32 4 warps
    # 56 B at 128 (8 warps: 220/0).
    "pieces_forward": dict.fromkeys((16, 32, 64, 128), Tiles(128, 32, 8, 2)),
    "pieces_dkdv": dict.fromkeys((16, 32, 64, 128), Tiles(32, 32, 8, 2)),
    "pieces_dq": {16: Tiles(64, 32, 8, 2), 32: Tiles(64, 32, 8, 2), 64: Tiles(64, 32, 8, 2), 128: Tiles(32, 32, 8, 2)},
    "pieces_dq_grad": {16: Tiles(32, 32, 4, 2), 32: Tiles(32, 32, 4, 2), 64: Tiles(32, 32, 4, 2),
                       128: Tiles(32, 32, 8, 2)},
    # pieces_dq_param with TF32 (pieces_dq_grad: 3.11 instructions per pair and warp at Dh 64, 7.13 at 128): Dh 64
    # 128x16 8 warps 253/0/513 (2.00; 128x32 16 B spilled, 64x32 4 warps 72 B); Dh 128 32x64 8 warps 248/0/987
    # (3.86; 128x16 168 B, 64x16 4 warps 392 B); Dh 16, 32 128x32 8 warps 223/0 and 238/0 (1.35, 1.39).
    "pieces_dq_param": {16: Tiles(128, 32, 8, 2), 32: Tiles(128, 32, 8, 2), 64: Tiles(128, 16, 8, 2),
                        128: Tiles(32, 64, 8, 2)},
}
FP32_MAX_HEAD_DIM = 128
TILES = {(kernel, dim, dtype): t
         for dtype, table in ((torch.bfloat16, _BY_HEAD_DIM), (torch.float16, _BY_HEAD_DIM),
                              (torch.float32, _FP32_BY_HEAD_DIM))
         for kernel, by_dim in table.items() for dim, t in by_dim.items()}
INTERPRETED_TILES = Tiles(16, 16, 1, 1)  # Triton's interpreter (tests): small tiles, numpy per tile


def padded_head_dim(head_dim: int) -> int:
    return max(16, next_power_of_2(head_dim))


def gpu_tiles(kernel: str, head_dim: int, dtype: torch.dtype) -> Tiles:
    return TILES[kernel, padded_head_dim(head_dim), dtype]


def tiles(kernel: str, head_dim: int, device: torch.device, dtype: torch.dtype) -> Tiles:
    """The tiles a launch uses: the GPU table, or the interpreter's small tiles on a CPU (tests force the GPU's
    by replacing this function)."""
    return INTERPRETED_TILES if device.type == "cpu" else gpu_tiles(kernel, head_dim, dtype)


def tf32_allowed() -> bool:
    return torch.get_float32_matmul_precision() != "highest"  # "high" / "medium": torch's own matmuls use TF32


def serves_float32(head_dim: int, interpreted: bool) -> bool:
    """float32 runs here only as TF32, where torch allows TF32 for its own matmuls, and up to Dh 128; otherwise
    the exact float32 paths serve it. (The non-tensor-core float32 dot spilled 6.5-29 KB per thread; three TF32
    products, tf32x3, spilled 100 B-16 KB and took up to 327 KB of shared memory: the static table.)"""
    return interpreted or (tf32_allowed() and head_dim <= FP32_MAX_HEAD_DIM)


def precision(dtype: torch.dtype, interpreted: bool) -> str:
    """tl.dot's input precision: 16-bit types on tensor cores as they are, float32 as TF32 (serves_float32);
    the interpreter multiplies exactly."""
    return "ieee" if interpreted else "tf32"


def nearest_tf32(t: Tensor) -> Tensor:
    """float32 t as the nearest TF32 value, ties away from zero: attention_kernels._nearest_tf32 on the host."""
    return ((t.view(torch.int32) + 0x1000) & -8192).view(torch.float32)


def output_gradient_and_delta(dout: Tensor, out: Tensor) -> tuple[Tensor, Tensor]:
    """The backward's dO (B,H,Tq,Dh) as its products read it and FlashAttention-2's D = rowsum(dO * O) (B,H,Tq),
    float32. D stands for rowsum(P * dP), dP = dO V^T, so the rows of dS = P (dP - D) sum to 0; with dP on TF32
    operands it must take the dO that dP reads. Left to the tensor cores, dO would be truncated in dP only (biased
    towards 0: every query's dS summed to about -1e-3, a sum of dS over many queries drifted); rounded here to
    the nearest TF32 value, both read the same dO."""
    if dout.dtype == torch.float32 and precision(dout.dtype, dout.device.type == "cpu") == "tf32":
        dout = nearest_tf32(dout)
    return dout, (dout.float() * out.float()).sum(-1)


def launch(kernel, grid: tuple[int, ...], *args, **options) -> None:
    """Every kernel launch of this module (the static check compiles what passes through here instead)."""
    kernel[grid](*args, **options)


def _options(t: Tiles, dtype: torch.dtype, device: torch.device) -> Mapping[str, object]:
    """The launch options of tiles t (read-only: one mapping per key, made once; launches unpack it)."""
    return _options_of(t, dtype, device)


@functools.lru_cache(maxsize=256)
def _options_of(t: Tiles, dtype: torch.dtype, device: torch.device) -> Mapping[str, object]:
    interpreted = device.type == "cpu"
    options = {"PRECISION": precision(dtype, interpreted), "UPCAST": interpreted}
    if not interpreted:
        options.update(num_warps=t.warps, num_stages=t.stages)
    return MappingProxyType(options)


def _dense_last(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _bhd(t: Tensor) -> tuple[int, ...]:
    """The strides of (B, H, T) of a (B,H,T,Dh) tensor (one stride() call: host time, several per launch)."""
    return t.stride()[:3]


def _check_sizes(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Refuse, before any launch, what the kernels cannot address: heads or batch past a grid axis, and a head
    whose slice passes int32 offsets (the kernels' per-tile arithmetic). Answered once per layout."""
    _check_layouts(q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride())


@functools.lru_cache(maxsize=256)
def _check_layouts(q_shape: torch.Size, q_strides: tuple[int, ...], k_shape: torch.Size, k_strides: tuple[int, ...],
                   v_shape: torch.Size, v_strides: tuple[int, ...]) -> None:
    b, h, _, d = q_shape
    if h > GRID_AXIS_LIMIT or b > GRID_AXIS_LIMIT:
        raise ValueError(f"attention on the GPU: B={b}, H={h}; the kernels put each on a grid axis of at most "
                         f"{GRID_AXIS_LIMIT}")
    for name, shape, strides in (("q", q_shape, q_strides), ("k", k_shape, k_strides), ("v", v_shape, v_strides)):
        extent = shape[2] * strides[2] + d
        if extent >= INT32_LIMIT:
            raise ValueError(f"attention on the GPU: {name} {tuple(shape)} with stride {strides[2]} per position "
                             f"spans {extent} elements per head; the kernels address at most 2^31 - 1 "
                             f"(split the sequence or make the tensor contiguous per head)")


def _padded_rows(rows: Tensor, pad: int) -> tuple[Tensor, int]:
    """(H,S) -> a view of (H, S + 2 pad) rows in base-2 units starting at the real data, and its row stride. The
    padding lets every tile read its bias unmasked and unclamped (attention_kernels' docstring)."""
    padded = F.pad(rows * kernels.LOG2E, (pad, pad))
    return padded[:, pad:], padded.stride(0)


def _padded_rows_of(rows: Tensor, pad: int) -> Tensor:
    """rows as a caller holds them ((H,S) or (1,H,1,S), any float dtype) -> _padded_rows' view of them in float32,
    without autograd and not an inference tensor (padded_rows keeps it)."""
    return ordinary(lambda: _padded_rows(rows.detach().reshape(-1, rows.shape[-1]).to(torch.float32), pad)[0])


# rows, pad -> _padded_rows_of(rows, pad): once per forward, all layers share the rows (a mul and a pad each, per
# layer, before)
padded_rows = DerivedPerTensor(_padded_rows_of)


def row_pad(head_dim: int, device: torch.device, dtype: torch.dtype) -> int:
    """The padding on either side of the rows, wide enough for every kernel that reads them (ROW_KERNELS)."""
    return _row_pad(tiles, head_dim, device, dtype)  # tiles looked up per call: tests and the static check replace it


@functools.lru_cache(maxsize=64)
def _row_pad(tiles_of, head_dim: int, device: torch.device, dtype: torch.dtype) -> int:
    return _pad(*(tiles_of(kernel, head_dim, device, dtype) for kernel in ROW_KERNELS))


def _pad(*tile_sets: Tiles) -> int:
    widest = max(t.bm + t.bn for t in tile_sets)
    return -(-widest // 16) * 16  # a multiple of 16 floats keeps the view 64-byte aligned


def key_gradients(ctx, q: Tensor, k: Tensor, v: Tensor, dout: Tensor, lse: Tensor, delta: Tensor, biased: Tensor,
                  e: Tensor) -> tuple[Tensor, Tensor]:
    """dK, dV (B,Hkv,Tk,Dh) of the row kernel's backward (_dkdv): per query head, a GQA group's heads added up
    after, in float32 (deterministic, no atomics)."""
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    group = h // hkv
    kv_dtype = k.dtype if group == 1 else torch.float32
    dk_heads = torch.empty(b, h, tk, d, device=q.device, dtype=kv_dtype)
    dv_heads = torch.empty(b, h, tk, d, device=q.device, dtype=kv_dtype)
    t = tiles("dkdv", d, q.device, q.dtype)
    launch(kernels._dkdv, (cdiv(tk, t.bn), h, b), q, k, v, dout, lse, delta, dk_heads, dv_heads, biased, e,
           *_bhd(q), *_bhd(k), *_bhd(v), *_bhd(dout), h, group, tq, tk, ctx.row_stride, d**-0.5 * kernels.LOG2E,
           d**-0.5, D=d, CAUSAL=ctx.causal, HAS_BIAS=True, BD=padded_head_dim(d), BM=t.bm, BN=t.bn,
           **_options(t, q.dtype, q.device))
    if group == 1:
        return dk_heads, dv_heads
    return (dk_heads.view(b, hkv, group, tk, d).sum(2).to(k.dtype),
            dv_heads.view(b, hkv, group, tk, d).sum(2).to(v.dtype))


class _RowBiasAttention(torch.autograd.Function):
    """rows (H,S) float32 (the gradient's shape), biased: the rows as the kernels read them (padded_rows, with
    row_pad(Dh, q's device, q's dtype))."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, rows: Tensor, biased: Tensor, e: Tensor, causal: bool) -> Tensor:
        q, k, v = _dense_last(q), _dense_last(k), _dense_last(v)
        _check_sizes(q, k, v)
        b, h, tq, d = q.shape
        t = tiles("forward", d, q.device, q.dtype)
        row_stride = biased.stride(0)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)  # (B,H,Tq,Dh)
        lse = torch.empty(b, h, tq, device=q.device, dtype=torch.float32)  # base 2; the backward's softmax
        launch(kernels._forward, (cdiv(tq, t.bm), h, b),
               q, k, v, out, lse, biased, e, *_bhd(q), *_bhd(k), *_bhd(v), *_bhd(out),
               h, h // k.shape[1], tq, k.shape[2], row_stride, d**-0.5 * kernels.LOG2E,
               D=d, CAUSAL=causal, HAS_BIAS=True, BM=t.bm, BN=t.bn, BD=padded_head_dim(d),
               **_options(t, q.dtype, q.device))
        ctx.save_for_backward(q, k, v, out, lse, biased, e)
        ctx.causal, ctx.row_stride, ctx.row_len = causal, row_stride, rows.shape[1]
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse, biased, e = ctx.saved_tensors
        dout, delta = output_gradient_and_delta(_dense_last(dout), out)  # delta (B,H,Tq)
        b, h, tq, d = q.shape
        tk, group = k.shape[2], h // k.shape[1]
        dk, dv = key_gradients(ctx, q, k, v, dout, lse, delta, biased, e)
        strides = (*_bhd(q), *_bhd(k), *_bhd(v), *_bhd(dout))
        scales = (d**-0.5 * kernels.LOG2E, d**-0.5)
        shape = dict(D=d, CAUSAL=ctx.causal, HAS_BIAS=True, BD=padded_head_dim(d))
        row_grad = ctx.needs_input_grad[3]
        t = tiles("dq_rows" if row_grad else "dq", d, q.device, q.dtype)
        q_blocks, diag_len = cdiv(tq, t.bm), cdiv(tk, t.bn) * t.bn + t.bn
        # ROW_GRAD: zeros (the diagonal sums leave entries no program writes); else a placeholder the kernel never
        # reads or writes (no fill to launch)
        diag = (torch.zeros if row_grad else torch.empty)(b * h, q_blocks, diag_len if row_grad else 1,
                                                           device=q.device, dtype=torch.float32)
        dq = torch.empty(b, h, tq, d, device=q.device, dtype=q.dtype)
        launch(kernels._dq, (q_blocks, h, b), q, k, v, dout, lse, delta, dq, biased, e, diag, *strides,
               h, group, tq, tk, ctx.row_stride, diag.shape[-1], *scales,
               ROW_GRAD=row_grad, BM=t.bm, BN=t.bn, **shape, **_options(t, q.dtype, q.device))
        drow = None
        if row_grad:
            drow = torch.empty(h, ctx.row_len, device=q.device, dtype=torch.float32)
            launch(kernels._row_reduce, (h, cdiv(ctx.row_len, REDUCE_BLOCK)), diag, e, drow, b, h, q_blocks,
                   diag_len, ctx.row_len, BM=t.bm, BR=REDUCE_BLOCK)
        return dq, dk, dv, drow, None, None, None


def check_qkv(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> None:
    """What every attention kernel here needs of q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh): one dtype, H a multiple of Hkv,
    and causal queries no more than the keys (queries are the last keys); a one-line error before any work."""
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes: {q.dtype}, {k.dtype}, {v.dtype}; expected one dtype")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"query heads H={q.shape[1]}: expected a multiple of the key heads Hkv={k.shape[1]}")
    if causal and q.shape[2] > k.shape[2]:
        raise ValueError(f"causal attention with Tq={q.shape[2]} queries: expected Tq <= Tk={k.shape[2]}")


def attend_rows(q: Tensor, k: Tensor, v: Tensor, rows: Tensor, e: Tensor, causal: bool) -> Tensor:
    """q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh) in bf16, fp16 or fp32 (one dtype), rows (H,S) or (1,H,1,S), e (B,)
    -> (B,H,Tq,Dh) in q's dtype, accumulated in float32. Causal needs Tq <= Tk (queries are the last keys)."""
    check_qkv(q, k, v, causal)
    if rows.shape[-1] < 1 or rows.numel() != q.shape[1] * rows.shape[-1] or not rows.is_floating_point():
        raise ValueError(f"rows {tuple(rows.shape)} {rows.dtype}: expected floats (H,S) or (1,H,1,S) with "
                         f"H={q.shape[1]} (q {tuple(q.shape)}) and S >= 1")
    biased = padded_rows(rows, row_pad(q.shape[-1], q.device, q.dtype))
    rows = rows.reshape(q.shape[1], rows.shape[-1]).to(torch.float32)  # (H,S)
    return _RowBiasAttention.apply(q, k, v, rows, biased, per_batch_row(e.to(q.device), q), causal)


__all__ = ["TILES", "Tiles", "attend_rows", "check_qkv", "gpu_tiles", "key_gradients", "launch", "serves_float32",
           "tiles"]
