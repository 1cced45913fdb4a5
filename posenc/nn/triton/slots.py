"""The static decode step's attention under a position map on the GPU (slot_kernels.py): a plan made once per layer
shape (the shares of the slots from the cache's size and the device's SM count, the tiles), then two launches per
step, the shares' pass and their merge, with nothing read back by the host and no shape that depends on the step:
a CUDA graph captures both. Notation as in posenc.nn.static_attention.

Tiles: one program's rows are R = GP * MP (>= 16), its key block (BW, BN) with BW the padded W; BN 64, 4 warps, 3
stages in 16-bit types (8 warps for keys 256 wide or more), 8 warps and 2 stages in float32 (the static table,
benchmarks/gpu_static.py slot_records). float32 multiplies exactly ("ieee", as the PyTorch path's float32 product
without TF32); float64 stays on the PyTorch path (map_slot_attention).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posenc.nn.triton import cdiv, next_power_of_2
from posenc.nn.triton import slot_kernels as kernels
from posenc.nn.triton.attention import GRID_AXIS_LIMIT, Tiles

# Sweeps compiled for sm_90 (registers / spilled bytes / shared KB / loop instructions a tile and warp), Self-Extend
# (W = 2 Dh) and DCA (W = Dh) at Dh 64 and 128, SmolLM2's 9:3 heads. bf16: 16x64 4 warps 3 stages 106/0/55/333,
# 72/0/37/307, 128/0/107/464, 100/0/71/372 (20.8 warp instructions a slot at Dh 64: the fewest but 16x128 4 warps 2
# stages' 15.6, which halves the shares a 4k cache can take); 16x64 8 warps 3 stages 31.8, 16x32 4 warps 3 stages
# 30.6. float32 (exact products, on CUDA cores: no HMMA, so no loop count): 16x32 4 warps 2 stages spilled 160 B at
# Dh 64, 16x64 3 stages 16 B at Dh 128 (219 KB shared); 16x64 8 warps 2 stages 70/0/61, 48/0/41, 80/0/117, 68/0/77.
# Keys 256 wide or more (padded): 16x64 4 warps spilled 8 B at Dh 80 and 96 with two tables (their masked loads);
# 8 warps 3 stages 128/0/106/360 there, and at Dh 128 100/0/106/307 (Self-Extend), 78/0/70/271 (DCA), Dh 256
# 126/0/210/455 and 102/0/138/346.
GPU_TILES = Tiles(16, 64, 4, 3)  # bm: the least rows per program (tl.dot's 16)
WIDE_TILES = Tiles(16, 64, 8, 3)
WIDE = 256
FP32_TILES = Tiles(16, 64, 8, 2)
INTERPRETED_TILES = Tiles(16, 16, 1, 1)
# The query rows a program holds, R x BW (R = GP * MP, BW the padded W), per dtype: (most rows, most elements).
# Compiled: bf16 R 64 x BW 128 and R 32 x BW 256 147-164 registers, R 16 x BW 512 (Dh 256, two tables) 179 and 211 KB
# shared, no spill; float32 R 64 x BW 64 spilled 8 B (R 64 x 128: 6 KB), R 16 x BW 512 took 229 KB of shared memory
# (an H100 block may use 227), R 32 x BW 128 and R 16 x BW 256 spill nothing.
MAX_QUERY_TILE = {torch.bfloat16: (64, 8192), torch.float16: (64, 8192), torch.float32: (32, 4096)}
MAX_HEAD_DIM = 256
SPLIT_MIN_BLOCKS = 4  # blocks of BN slots per share at least: fewer, and the merge costs more than the spread gives
INTERPRETED_SHARES = 2  # the interpreter: two shares where there are two blocks, so every test takes the merge
MERGE_ELEMENTS = 4096  # float32 partial outputs a merge program loads at once (BS x BD): 32 a thread at 4 warps
SERVED = (torch.bfloat16, torch.float16, torch.float32)


def launch(kernel, grid: tuple[int, ...], *args, **options) -> None:
    """Every launch of this module (the static check, benchmarks/gpu_static.py, records these instead)."""
    kernel[grid](*args, **options)


@dataclass(frozen=True)
class SlotPlan:
    """One layer shape's launch: queries (B,H,M+1,W), keys (B,Hkv,L,W), values (B,Hkv,L,Dh)."""

    batch: int
    heads: int
    kv_heads: int
    maps: int  # M+1
    width: int  # W
    head_dim: int
    slots: int  # L
    dtype: torch.dtype
    shares: int  # S: programs per (KV head, batch row), each over `share` slots (the last over the rest)
    share: int
    tiles: Tiles
    interpreted: bool
    skip_unscored: bool = False  # blocks of slots no map scores: their keys and values are not read


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # the static check's meta tensors: an H100 (and an H200)
    return torch.cuda.get_device_properties(device).multi_processor_count


def shares_for(programs: int, slots: int, bn: int, device: torch.device) -> int:
    """Shares of the slots per (KV head, batch row): about two programs per SM, each over SPLIT_MIN_BLOCKS blocks or
    more; the interpreter two where there are two blocks."""
    blocks = cdiv(slots, bn)
    if device.type == "cpu":
        return min(INTERPRETED_SHARES, blocks)
    return max(1, min(2 * sm_count(device) // programs, blocks // SPLIT_MIN_BLOCKS))


def plan(queries: Tensor, keys: Tensor, v: Tensor, mask: Tensor, shares: int | None = None,
         skip_unscored: bool = False) -> SlotPlan | None:
    """The plan for these shapes, or None where the kernel does not serve them (another dtype, a head dim, width or
    row count past its limits, tensors on other devices). shares: the share count (tests), else shares_for's."""
    b, h, maps, w = queries.shape
    hkv, slots, dh = keys.shape[1], keys.shape[2], v.shape[-1]
    dtype = queries.dtype
    if (dtype not in SERVED or not (keys.dtype == v.dtype == mask.dtype == dtype) or h % hkv
            or keys.shape != (b, hkv, slots, w) or v.shape != (b, hkv, slots, dh) or mask.dim() != 5
            or mask.shape[-2:] != (maps, slots) or mask.shape[0] not in (1, b) or dh > MAX_HEAD_DIM
            or hkv > GRID_AXIS_LIMIT or b > GRID_AXIS_LIMIT or len({t.device for t in (queries, keys, v, mask)}) != 1):
        return None
    gp, mp = rows(h // hkv, maps)
    most_rows, most_elements = MAX_QUERY_TILE[dtype]
    if gp * mp > most_rows or gp * mp * padded(w) > most_elements:
        return None
    interpreted = queries.device.type == "cpu"
    t = (INTERPRETED_TILES if interpreted else FP32_TILES if dtype == torch.float32
         else WIDE_TILES if padded(w) >= WIDE else GPU_TILES)
    wanted = shares if shares is not None else shares_for(b * hkv, slots, t.bn, queries.device)
    share = cdiv(cdiv(slots, max(1, wanted)), t.bn) * t.bn  # a multiple of BN: only the last share is ragged
    return SlotPlan(b, h, hkv, maps, w, dh, slots, dtype, cdiv(slots, share), share, t, interpreted, skip_unscored)


def padded(n: int) -> int:
    return max(16, next_power_of_2(n))


def rows(group: int, maps: int) -> tuple[int, int]:
    """(GP, MP): the query heads and maps of a program's rows, each a power of 2, GP * MP >= 16 (tl.dot's least)."""
    mp = next_power_of_2(maps)
    return max(next_power_of_2(group), 16 // mp), mp


def attend(p: SlotPlan, queries: Tensor, keys: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """map_slot_attention's math by the plan p: queries (B,H,M+1,W), keys (B,Hkv,L,W), v (B,Hkv,L,Dh), mask
    (B|1,1,1,M+1,L) -> (B,H,1,Dh) in their dtype. The shares' partials are float32, (S,B,H,Dh) and twice (S,B,H)."""
    queries, keys, v, mask = (t if t.stride(-1) == 1 else t.contiguous() for t in (queries, keys, v, mask))
    acc = torch.empty(p.shares, p.batch, p.heads, p.head_dim, device=queries.device, dtype=torch.float32)
    best = torch.empty(p.shares, p.batch, p.heads, device=queries.device, dtype=torch.float32)
    total = torch.empty_like(best)
    out = torch.empty(p.batch, p.heads, 1, p.head_dim, device=queries.device, dtype=p.dtype)
    gp, mp = rows(p.heads // p.kv_heads, p.maps)
    bw, bd, t = padded(p.width), padded(p.head_dim), p.tiles
    options = {"PRECISION": "ieee", "UPCAST": p.interpreted}
    if not p.interpreted:
        options.update(num_warps=t.warps, num_stages=t.stages)
    even = p.slots % t.bn == 0 and bw == p.width and bd == p.head_dim
    mask_b = mask.stride(0) if mask.shape[0] > 1 else 0
    launch(kernels._slot_forward, (p.shares, p.kv_heads, p.batch), queries, keys, v, mask, acc, best, total,
           *queries.stride()[:3], *keys.stride()[:3], *v.stride()[:3], mask_b, mask.stride(3),
           p.batch, p.heads, p.heads // p.kv_heads, p.maps, p.slots, p.width, p.share,
           D=p.head_dim, BW=bw, BD=bd, GP=gp, MP=mp, BN=t.bn, EVEN=even, SKIP=p.skip_unscored, **options)
    bs = min(next_power_of_2(p.shares), max(1, MERGE_ELEMENTS // bd))
    merge_options = {} if p.interpreted else {"num_warps": 4}
    launch(kernels._merge_shares, (p.batch * p.heads,), acc, best, total, out, p.batch * p.heads, p.shares,
           D=p.head_dim, BD=bd, BS=bs, **merge_options)
    return out


__all__ = ["SlotPlan", "attend", "plan"]
