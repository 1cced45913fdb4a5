"""Attention under a position map on the GPU, one launch per call (mapped_kernels.py): prefill and decode,
inference only. The caller (posenc.nn.mapped_gpu) builds the cos/sin rows of every map from the scheme's own
rotation; this module checks shapes, picks tiles and launches.

The keys come rotated by the host, once per distinct key position tensor, in their dtype (with a KV cache, kept
there: a decode step rotates only its new key), and the loop reads a tile as plain flash attention does; or, where
no cache keeps them and a step would rotate every key for one query, raw with cos/sin rows per key, and the kernel
rotates each key tile.

Where the grid has fewer programs than about two per SM (a decode step, a short chunk after a long cache), the keys
are split into shares, one program each, and the shares' outputs merged by their log-sum-exps (flash-decoding):
torch operations on the device, no value read back by the host.

Tiles per (decode, padded head dim): a prefill program holds M rotated query copies (M <= 3 maps) next to the
accumulator, so its key tiles are short (BN 32); decoding has one query per row, so BM is the smallest tile tl.dot
takes (16). Justified by the static table (benchmarks/gpu_static.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.nn.triton import cdiv, next_power_of_2
from posenc.nn.triton import mapped_kernels as kernels
from posenc.nn.triton.attention import GRID_AXIS_LIMIT, Tiles, precision
from posenc.nn.triton.attention_kernels import LOG2E
from posenc.position_map import PAIR_RULES, PairRule

MAX_MAPS = 3  # query copies held per program (DCA's three)
# Sweeps at bf16, DCA (three maps: the most registers), registers / spilled bytes / loop instructions: Dh 128
# 128x32 8 warps 254/0/1233; 128x64 8 warps 255/608/2902; 64x64 4 warps 255/584/2994. Self-Extend at 128: 128x32
# 227/0/726, 128x64 256 B spilled. Dh 64: 128x64 8 warps 328 B spilled. With the whole-tile path (a tile under one
# map, unmasked) beside the per-pair one, Dh 256's 64x32 spilled 16 B; 64x16 8 warps 238/0 (32x32: 1.3x the
# instructions per pair).
_PREFILL = {16: Tiles(128, 32, 8, 2), 32: Tiles(128, 32, 8, 2), 64: Tiles(128, 32, 8, 2),
            128: Tiles(128, 32, 8, 2), 256: Tiles(64, 16, 8, 2)}
# Decoding (keys split into shares): Dh 32 16x64 4 warps spilled 8 B (stack), 8 warps none. With the whole-tile
# path, 16x64 8 warps spilled 16-24 B at Dh 16 and 32 (16x32 8 warps: none, 15 instructions per key against 18 at
# 16x64 4 warps), and 16x64 4 warps 8 B at Dh 80 and 96 (8 warps: none).
_DECODE = {16: Tiles(16, 32, 8, 2), 32: Tiles(16, 32, 8, 2), 64: Tiles(16, 64, 4, 2),
           128: Tiles(16, 64, 8, 2), 256: Tiles(16, 32, 4, 2)}
INTERPRETED_TILES = Tiles(16, 16, 1, 1)


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
    table = (_FP32_DECODE if dtype == torch.float32 else _DECODE) if decode else _PREFILL
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
    q_pos, k_pos = (p.expand(b, n).to(device=q.device, dtype=torch.int32).contiguous()
                    for p, n in ((q_pos, tq), (k_pos, tk)))
    t = tiles(tq == 1, dh, q.device, q.dtype)
    q_blocks = cdiv(tq, t.bm)
    splits = key_splits(q_blocks * h * b, tk, t.bn, q.device)
    if splits > 1:  # flash-decoding: partial outputs and log-sum-exps per share of the keys, merged below
        out = torch.empty(splits, b, h, tq, dh, device=q.device, dtype=torch.float32)
        lse = torch.empty(splits, b, h, tq, device=q.device, dtype=torch.float32)
    else:
        out = torch.empty(b, h, tq, dh, device=q.device, dtype=q.dtype)
        lse = out  # unread
    interpreted = q.device.type == "cpu"
    options = {"PRECISION": precision(q.dtype, interpreted), "UPCAST": interpreted}
    if not interpreted:
        options.update(num_warps=t.warps, num_stages=t.stages)
    rest = dh - 2 * half
    launch(kernels._mapped_forward, (q_blocks * splits, h, b), q, *by_map, v, out, lse, q_pos, k_pos, *tables,
           *q.stride()[:3], *keys[0].stride()[:3], *v.stride()[:3], *out.stride()[-4:-1],
           b, h, h // hkv, tq, tk, splits, score_scale * dh**-0.5 * LOG2E, rule.a, rule.b, rule.window,
           D=dh, HALF=half, REST=rest, INTERLEAVED=interleaved, KIND=rule.kind, WINDOWED=rule.window > 0,
           N_MAPS=n_maps, KEY_MAP1=key_maps[1] if n_maps > 1 else 0, KEY_MAP2=key_maps[2] if n_maps > 2 else 0,
           ROTATED=rotated, CAUSAL=causal, BM=t.bm, BN=t.bn, BP=padded(half), BR=padded(rest), BD=padded(dh),
           SPLIT=splits > 1, **options)
    if splits == 1:
        return out
    weights = torch.exp2(lse - lse.amax(0, keepdim=True))  # (S,B,H,Tq): 0 for a share with no key attended
    return ((weights[..., None] * out).sum(0) / weights.sum(0)[..., None]).to(q.dtype)


__all__ = ["MAX_MAPS", "attend_mapped", "gpu_tiles", "key_splits", "launch", "tiles"]
