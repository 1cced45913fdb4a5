"""Attention under a position map on the GPU, one launch per call, inference only: a prompt or a chunk of queries
(Tq > 1) through mapped_prefill_kernels.py, one map per program; a decode step through mapped_kernels.py, every map
scored per pair in each program. The caller (posenc.nn.mapped_gpu) builds the cos/sin rows of every map from the
scheme's own rotation; this module checks shapes, picks tiles and launches.

The keys come rotated by the host, once per distinct key position tensor, in their dtype (with a KV cache, kept
there: a decode step rotates only its new key), and the loop reads a tile as plain flash attention does; or, where
no cache keeps them and a step would rotate every key for one query, raw with cos/sin rows per key, and the kernel
rotates each key tile.

Partial outputs are merged by their log-sum-exps (flash-decoding), torch operations on the device, no value read
back by the host: a prefill's M maps (one program each per query block), and, where the grid has fewer programs
than about two per SM (a decode step, a short chunk after a long cache), the shares the keys are split into.

Tiles per (decode, padded head dim): a prefill program holds one rotated query copy, so it takes the row kernel's
tiles (128x64); decoding has one query per row, so BM is the smallest tile tl.dot takes (16), and its program holds
every map's copy. Justified by the static table (benchmarks/gpu_static.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.nn.triton import cdiv, next_power_of_2
from posenc.nn.triton import mapped_kernels as kernels
from posenc.nn.triton import mapped_prefill_kernels as prefill_kernels
from posenc.nn.triton.attention import GRID_AXIS_LIMIT, Tiles, precision
from posenc.nn.triton.attention_kernels import LOG2E
from posenc.position_map import PAIR_RULES, PairRule

LN2 = 0.6931471805599453  # a log-sum-exp in base 2 times this: in base e
MAX_MAPS = 3  # DCA's three; a decode program holds a query copy per map
# Prefill (one map per program, mapped_prefill_kernels.py): the row kernel's forward tiles. Sweeps at bf16 (registers
# / spilled bytes / unmasked-loop instructions), DCA and LM-Infinite: 128x64 8 warps 3 stages 146-226/0/265-376 at
# Dh 16-128; Dh 256 64x32 8 warps 2 stages 238-242/0/344 (64x64: 32-40 B spilled). The per-pair program of before
# (every map's query copy held: 128x32, and 64x16 at Dh 256) spent 0.46 instructions per pair at Dh 128 on a tile
# under one map, this one's unmasked loop 0.37; and its K/V loads sat in branches, plain LDG with no cp.async (the
# pipeliner skips loads under an if), where this loop's are pipelined (LDGSTS, 3 stages) as the row kernel's.
_PREFILL = {16: Tiles(128, 64, 8, 3), 32: Tiles(128, 64, 8, 3), 64: Tiles(128, 64, 8, 3),
            128: Tiles(128, 64, 8, 3), 256: Tiles(64, 32, 8, 2)}
# float32 (TF32): the row kernel's 128x32 8 warps 2 stages, 122-255/0/226-388 at Dh 16-128 (every map and head dim).
_FP32_PREFILL = {16: Tiles(128, 32, 8, 2), 32: Tiles(128, 32, 8, 2), 64: Tiles(128, 32, 8, 2),
                 128: Tiles(128, 32, 8, 2)}
# Decoding (keys split into shares): Dh 32 16x64 4 warps spilled 8 B (stack), 8 warps none. With the whole-tile
# path, 16x64 8 warps spilled 16-24 B at Dh 16 and 32 (16x32 8 warps: none, 15 instructions per key against 18 at
# 16x64 4 warps), and 16x64 4 warps 8 B at Dh 80 and 96 (8 warps: none).
_DECODE = {16: Tiles(16, 32, 8, 2), 32: Tiles(16, 32, 8, 2), 64: Tiles(16, 64, 4, 2),
           128: Tiles(16, 64, 8, 2), 256: Tiles(16, 32, 4, 2)}
INTERPRETED_TILES = Tiles(16, 16, 1, 1)


def pair_keys(bn: int, device: torch.device) -> int:
    """Keys per tile of a prefill program's per-pair loops (mixed tiles: more live values than the unmasked loop):
    half the key tile on a GPU; the interpreter's whole tile (the tests' cost is per loop step; two tests take half)."""
    return bn if device.type == "cpu" else bn // 2


TILE_CHUNK = 256  # key tiles a prefill program classifies at once before a map's pass (32k keys: 2 steps at BN 64)


def launch(kernel, grid: tuple[int, ...], *args, **options) -> None:
    """Every launch of this module (the static check, benchmarks/gpu_static.py, records these instead)."""
    kernel[grid](*args, **options)


def padded(n: int) -> int:
    return max(16, next_power_of_2(max(1, n)))


# float32 (TF32) decoding: 16x64 and 16x32 left 8-16 B of stack at Dh 16-128 in one map or another (the full sweep);
# 16x32 4 warps at Dh 16 and 16x16 4 warps above spill nothing. With the whole-tile path, LM-Infinite's key-rotating
# step at Dh 64 spilled 8 B at 16x16 4 warps (16x32 4 warps: none), and Dh 32's 16x16 8 B (16x32 8 warps: none).
_FP32_DECODE = {16: Tiles(16, 32, 4, 2), 32: Tiles(16, 32, 8, 2), 64: Tiles(16, 32, 4, 2), 128: Tiles(16, 16, 4, 2)}


def gpu_tiles(decode: bool, head_dim: int, dtype: torch.dtype) -> Tiles:
    if decode:
        table = _FP32_DECODE if dtype == torch.float32 else _DECODE
    else:
        table = _FP32_PREFILL if dtype == torch.float32 else _PREFILL
    return table[padded(head_dim)]


def tiles(decode: bool, head_dim: int, device: torch.device, dtype: torch.dtype) -> Tiles:
    """The interpreter's small tiles on a CPU, else the GPU table by padded head dim (the static check replaces
    this function to compile the GPU's)."""
    return INTERPRETED_TILES if device.type == "cpu" else gpu_tiles(decode, head_dim, dtype)


SPLIT_MIN_TILES = 4  # key tiles per share at least: fewer, and the merge costs more than the parallelism gives
INTERPRETED_SPLITS = 2


def key_splits(programs: int, tk: int, bn: int, device: torch.device) -> int:
    """Shares of the keys per query block: 1 where the grid already fills the GPU (prefill), else enough programs
    for about two per SM, each over SPLIT_MIN_TILES key tiles or more (decoding against a long cache). The
    interpreter splits in two where the grid has two programs at most (the tests' decoding takes the merge)."""
    tiles = cdiv(tk, bn)
    if device.type == "cpu":
        return INTERPRETED_SPLITS if programs <= 2 and tiles >= 2 else 1
    wanted = 2 * _sm_count(device) // programs
    return max(1, min(wanted, tiles // SPLIT_MIN_TILES))


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # the static check's meta tensors: an H100
    return torch.cuda.get_device_properties(device).multi_processor_count


def attend_mapped(q: Tensor, k: Tensor | tuple[Tensor, ...], v: Tensor, q_cos: Tensor, q_sin: Tensor,
                  key_rows: tuple[Tensor, Tensor] | None, key_maps: tuple[int, ...], q_pos: Tensor, k_pos: Tensor,
                  rule: PairRule, causal: bool, score_scale: float, interleaved: bool) -> Tensor:
    """q (B,H,Tq,Dh) unrotated; q_cos/q_sin (M,B,Tq,R/2) float32, the rotation at each map's query positions;
    key_rows: (k_cos, k_sin) (Mk,B,Tk,R/2), the rotation of each distinct key position tensor, with k (B,Hkv,Tk,Dh)
    unrotated (the kernel rotates each key tile), or None with k a tuple of Mk key tensors (B,Hkv,Tk,Dh) already
    rotated, one per key table; v (B,Hkv,Tk,Dh); key_maps[m] the key table of map m (key_maps[0] == 0); q_pos
    (B,Tq), k_pos (B,Tk) integers; rule: which map scores a pair -> (B,H,Tq,Dh) in q's dtype."""
    rotated = key_rows is None
    keys = tuple(k) if rotated else (k,)
    b, h, tq, dh = q.shape
    hkv, tk = v.shape[1], v.shape[2]
    n_maps, half = q_cos.shape[0], q_cos.shape[-1]
    n_keys = len(keys) if rotated else key_rows[0].shape[0]
    if not 1 <= n_maps <= MAX_MAPS or len(key_maps) != n_maps or key_maps[0] != 0 or max(key_maps) >= n_keys:
        raise ValueError(f"position map tables: {n_maps} maps with key tables {key_maps} of {n_keys}; expected 1 to "
                         f"{MAX_MAPS} maps, one key table index each, map 0 on key table 0")
    if q_cos.shape != (n_maps, b, tq, half) or 2 * half > dh or any(t.shape != v.shape for t in keys) or (
            not rotated and key_rows[0].shape != (n_keys, b, tk, half)):
        raise ValueError(f"position map tables {tuple(q_cos.shape)}, keys {[tuple(t.shape) for t in keys]}: expected "
                         f"(M,{b},{tq},R/2) with R <= {dh}, keys like v {tuple(v.shape)}, with (Mk,{b},{tk},R/2) "
                         "tables or one rotated per key table")
    if not rotated and tq > 1:
        raise ValueError(f"position map key tables with Tq={tq} queries: keys rotated in the kernel serve one query "
                         "(a decode step); expected the keys rotated, one tensor per key table")
    if rule.kind not in PAIR_RULES or (rule.kind == PAIR_RULES[-1] and rule.a < 1):
        raise ValueError(f"pair rule {rule}: expected a kind in {PAIR_RULES} (chunks of a >= 1 positions)")
    if h > GRID_AXIS_LIMIT or b > GRID_AXIS_LIMIT or h % hkv:
        raise ValueError(f"mapped attention on the GPU: B={b}, H={h}, Hkv={hkv}; expected H a multiple of Hkv and "
                         f"each at most {GRID_AXIS_LIMIT}")
    q, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, v))
    keys = tuple(t if t.stride(-1) == 1 else t.contiguous() for t in keys)
    if any(t.stride() != keys[0].stride() for t in keys):  # one layout for every copy: the kernel takes one set
        keys = tuple(t.contiguous() for t in keys)
    by_map = [keys[key_maps[m] if rotated else 0] for m in range(n_maps)]
    by_map += [by_map[0]] * (MAX_MAPS - n_maps)  # unread
    k_tables = (q_cos, q_sin) if rotated else key_rows  # unread when rotated
    tables = [t.to(device=q.device, dtype=torch.float32).contiguous() for t in (q_cos, q_sin, *k_tables)]
    q_pos, k_pos = (p if p.dtype == torch.int32 and p.shape == (b, n) and p.is_contiguous() and p.device == q.device
                    else p.expand(b, n).to(device=q.device, dtype=torch.int32).contiguous()
                    for p, n in ((q_pos, tq), (k_pos, tk)))  # as posenc.nn.mapped_gpu's StepTables hold them
    prefill = tq > 1  # one map per program (mapped_prefill_kernels.py); a decode step: the per-pair kernel
    t = tiles(not prefill, dh, q.device, q.dtype)
    q_blocks = cdiv(tq, t.bm)
    per_block = n_maps if prefill else 1  # programs per query block and share of the keys
    splits = key_splits(q_blocks * per_block * h * b, tk, t.bn, q.device)
    shares = splits * per_block
    if shares > 1:  # partial outputs and log-sum-exps per map and share of the keys, merged below (flash-decoding)
        out = torch.empty(shares, b, h, tq, dh, device=q.device, dtype=torch.float32)
        lse = torch.empty(shares, b, h, tq, device=q.device, dtype=torch.float32)
    else:
        out = torch.empty(b, h, tq, dh, device=q.device, dtype=q.dtype)
        lse = out  # unread
    interpreted = q.device.type == "cpu"
    options = {"PRECISION": precision(q.dtype, interpreted), "UPCAST": interpreted}
    if not interpreted:
        options.update(num_warps=t.warps, num_stages=t.stages)
    qk_scale = score_scale * dh**-0.5 * LOG2E
    strides = (*q.stride()[:3], *keys[0].stride()[:3], *v.stride()[:3], *out.stride()[-4:-1])
    shape = dict(D=dh, HALF=half, INTERLEAVED=interleaved, KIND=rule.kind, WINDOWED=rule.window > 0, N_MAPS=n_maps,
                 CAUSAL=causal, BM=t.bm, BN=t.bn, BD=padded(dh), **options)
    grid = (q_blocks * shares, h, b)
    if prefill:
        k_lo, k_hi = _tile_bounds(k_pos, t.bn)
        launch(prefill_kernels._mapped_prefill, grid, q, *by_map, v, out, lse, q_pos, k_pos, k_lo, k_hi, *tables[:2],
               *strides, b, h, h // hkv, tq, tk, k_lo.shape[1], splits, qk_scale, rule.a, rule.b, rule.window,
               CHUNK=TILE_CHUNK, PBN=pair_keys(t.bn, q.device), PARTIAL=shares > 1, **shape)
    else:
        rest = dh - 2 * half
        launch(kernels._mapped_forward, grid, q, *by_map, v, out, lse, q_pos, k_pos, *tables, *strides, b, h,
               h // hkv, tq, tk, splits, qk_scale, rule.a, rule.b, rule.window, REST=rest,
               KEY_MAP1=key_maps[1] if n_maps > 1 else 0, KEY_MAP2=key_maps[2] if n_maps > 2 else 0,
               ROTATED=rotated, BP=padded(half), BR=padded(rest), SPLIT=splits > 1, **shape)
    if shares == 1:
        return out
    # (S,B,H,Tq) the shares' weights 2^lse / sum 2^lse, 0 for a share with no pair attended: one softmax, not the
    # five operators of its formula (a decode step pays each launch in every layer)
    weights = torch.softmax(lse * LN2, dim=0)
    return (weights[..., None] * out).sum(0).to(q.dtype)


def _tile_bounds(k_pos: Tensor, bn: int) -> tuple[Tensor, Tensor]:
    """k_pos (B,Tk) int32 -> the least and the greatest position of each BN-key tile, (B,ceil(Tk/BN)) int32 each
    (the ragged last tile over its keys only)."""
    pad = -k_pos.shape[1] % bn
    lo = F.pad(k_pos, (0, pad), value=kernels.BIG.value).view(k_pos.shape[0], -1, bn).amin(-1)
    hi = F.pad(k_pos, (0, pad), value=-kernels.BIG.value).view(k_pos.shape[0], -1, bn).amax(-1)
    return lo, hi


__all__ = ["MAX_MAPS", "attend_mapped", "gpu_tiles", "key_splits", "launch", "tiles"]
