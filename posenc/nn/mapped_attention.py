"""Exact attention under a PositionMap (Self-Extend, Dual Chunk Attention, LM-Infinite, attention sinks),
in chunks of queries so that memory is O(chunk x Tk), never (H, Tq, Tk).

For each chunk of queries and each map m, the keys that map m scores (a contiguous index range, found
from the selector) are scored at m's positions, giving m's softmax-normalised output and the log-sum-exp
of its scores; the maps merge by softmax over those log-sum-exps (ChunkLlama's merge_attn_outputs), which
is exactly the softmax over the merged score row. In inference each map runs one of PyTorch's fused kernels
that return the log-sum-exp: the flash kernel on the CPU (~5x faster than the eager form, measured at
SmolLM2's shapes), the memory-efficient one on CUDA (no scores in memory, so chunks can be long); the eager
form (scores in memory, budgeted) serves other devices, dropout, gradients, and is the reference the fused
ones are tested against. posenc.nn.dispatch picks one (map_fused, map_eager); called directly with fused=None,
the fused form runs wherever it serves.
Notation: B, H, Hkv, Tq, Tk, Dh as in attention.py; C the rows of one chunk; K the keys one map scores in it;
g = H // Hkv query heads per key/value head.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.errors import bad_value
from posenc.nn.call import Call, needs_grad
from posenc.nn.kv_cache import AppendOnly, _Grown, append_only_buffer, in_float32
from posenc.position_map import PositionMap
from posenc.scheme import Scheme

_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # returns (out, logsumexp)
_EFFICIENT = torch.ops.aten._scaled_dot_product_efficient_attention  # CUDA: (out, logsumexp, seed, offset)
# device -> the dtypes its fused kernel takes (CUDA's memory-efficient kernel refuses float64: the H200, 2026-11-27)
FUSED_DTYPES = {"cpu": (torch.float64, torch.float32, torch.bfloat16, torch.float16),
                "cuda": (torch.float32, torch.bfloat16, torch.float16)}
SCORE_BUDGET = 1 << 24  # score elements per chunk and map: 64 MiB in float32, a few copies at most live
# On a GPU, bigger chunks: each chunk costs launches and a sync (nonzero()). The eager form holds 512 MiB of
# float32 scores per chunk at most; the fused kernel holds none, only masks of the edges (a few bytes per
# score element of this budget), so its chunks are as long as GPU_MAX_ROWS at any length up to ~100k.
GPU_SCORE_BUDGET, GPU_FUSED_BUDGET = 1 << 27, 1 << 30


MAX_ROWS = 256  # a map's key range is a rectangle around a band (windows, chunks): short chunks waste less
# CUDA's fused kernel holds no scores and every chunk costs launches and a sync (nonzero): longer chunks
GPU_MAX_ROWS = 1024


def chunk_rows(batch: int, heads: int, tq: int, tk: int, budget: int | None = None, most: int = MAX_ROWS) -> int:
    """Query rows per chunk: as many as keep B * H * C * Tk within the budget (SCORE_BUDGET), at least one,
    at most `most`."""
    budget = SCORE_BUDGET if budget is None else budget
    return max(1, min(tq, most, budget // max(1, batch * heads * tk)))


def query_chunks(first_row: Tensor, rows: int, period: int | None) -> list[tuple[int, int]]:
    """(start, end) index ranges of at most `rows` queries; with a period (DCA's chunk), also cut where the first
    batch row's position is a multiple of it, so each map's key range is one chunk, not two half ones."""
    tq = first_row.shape[0]
    cuts = {0, tq}
    if period is not None:
        cuts |= set((first_row % period == 0).nonzero().flatten().tolist())
    bounds, out = sorted(cuts), []
    for a, b in pairwise(bounds):
        out += [(s, min(b, s + rows)) for s in range(a, b, rows)]
    return out


def _first(pos: Tensor) -> Tensor:
    """The dummy side's positions (B,1): pos itself when it holds one column (a decode step), so that rotate()
    sees one positions tensor and reads its tables once."""
    return pos if pos.shape[1] == 1 else pos[:, :1]


def _rotate_queries(scheme: Scheme, q: Tensor, pos: Tensor) -> Tensor:
    # rotate() takes a pair; a one-key dummy keeps the scheme's own q rotation (xPos scales q and k apart)
    return scheme.rotate(q, q[:, :1, :1], pos, _first(pos))[0]


def _rotate_keys(scheme: Scheme, k: Tensor, pos: Tensor, kept: dict | None = None, slot: Hashable = 0,
                 label: Hashable = "rotated keys", dtype: torch.dtype | None = None, source: AppendOnly | None = None,
                 rotate_new: Callable[[Tensor, int, Tensor], None] | None = None) -> Tensor:
    """k (B,Hkv,Tk,Dh) rotated at pos (B,Tk). With a KV cache's store, the keys rotated by earlier calls are reused:
    the cache's raw keys only grow, a key's mapped position depends on its own position alone (PositionMap's
    key_positions), and the rotation of a key on its own; so only keys past the kept ones are rotated, into the kept
    buffer's new places. The kept keys hold while pos derives, under the map the store's key names, from the same KV
    cache positions buffer `source` (kv_cache.append_only_buffer: appended to only, named across its growth): then
    no position is kept or compared. Without a source, the positions are kept and checked equal to pos's first ones
    (any mismatch: all rotated again). label, slot: the store's key (a key that names the map keeps each map's apart).
    dtype: what the kept keys are stored in (None: float32 for half precision, as the per-map kernels compute).
    rotate_new(keys, done, out): writes the keys past `done` rotated into out (default: the scheme's rotate())."""
    if kept is None:
        return scheme.rotate(k[:, :1, :1], k, _first(pos), pos)[1]
    entry, tk = kept.get((label, slot)), k.shape[2]
    done = 0 if entry is None else entry.keys.length
    if dtype is None:
        dtype = torch.float32 if k.element_size() < 4 else k.dtype  # half precision: rotated in float32
    if entry is not None and not (entry.scheme is scheme and done <= tk and entry.keys.data.dtype == dtype
                                  and entry.keys.data.shape[:2] == k.shape[:2] and entry.holds(pos, done, source)):
        entry, done = None, 0
    if entry is not None and done == tk:
        return entry.keys.data[:, :, :tk]
    fresh = k[:, :, done:] if k.dtype == dtype else k[:, :, done:].to(dtype)  # (B,Hkv,Tk-done,Dh)
    if entry is None:
        entry = kept[(label, slot)] = _Rotated(scheme, _Grown(fresh, time_dim=2),
                                               None if source is not None else _Grown(pos, time_dim=1), source)
    out = entry.keys.slot(tk - done)  # (B,Hkv,Tk-done,Dh), a view of the kept buffer
    if rotate_new is not None:
        rotate_new(fresh, done, out)
    else:
        out.copy_(scheme.rotate(fresh[:, :1, :1], fresh, _first(pos[:, done:]), pos[:, done:])[1])
    if entry.positions is not None:
        entry.positions.append(pos[:, done:])
    return entry.keys.data[:, :, :tk]


@dataclass
class _Rotated:
    """One map's keys as rotated so far (B,Hkv,T,Dh); the KV cache positions buffer their positions derived from, or
    (source None: another tensor) the positions they were rotated at (B,T)."""

    scheme: Scheme
    keys: _Grown
    positions: _Grown | None
    source: AppendOnly | None

    def holds(self, pos: Tensor, done: int, source: AppendOnly | None) -> bool:
        """The first `done` keys were rotated at pos's first positions: the same buffer named, or (kept positions)
        the same values (a comparison: a read of the device)."""
        if self.positions is None:
            return source is not None and self.source is source
        return torch.equal(self.positions.data[:, :done], pos[:, :done])


def mapped_attention(q: Tensor, k: Tensor, v: Tensor, scheme: Scheme, position_map: PositionMap,
                     q_pos: Tensor, k_pos: Tensor, causal: bool = True, dropout: float = 0.0,
                     budget: int | None = None, fused: bool | None = None, kept: dict | None = None) -> Tensor:
    """q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh) unrotated, the queries being the last Tq keys; q_pos (B,Tq), k_pos (B,Tk)
    -> (B,H,Tq,Dh). scheme rotates (its rotate()); position_map says at which positions and which keys.
    fused: a fused kernel per map, the CPU's flash or CUDA's memory-efficient one (None: on those devices, without
    dropout or gradients; their backward ignores the log-sum-exp that the merge differentiates, so training takes
    the eager form). kept: a KV cache's store for this layer (KVCache.derived): each map's rotated keys are kept
    there and a decode step rotates only its new keys (without gradients)."""
    dtype = q.dtype
    grad = needs_grad(q, k, v, scheme)
    kept = None if grad else kept
    if q.element_size() < 4:  # half precision: scores and sums in float32, one rounding at the end
        q, v = q.float(), in_float32(v, kept, "values in float32")
        k = k if kept is not None else k.float()  # kept: _rotate_keys converts the keys it rotates
    scale = position_map.score_scale(q_pos, k_pos[:, :1], k.shape[2])  # a number or (B,Tq): folded into q
    if isinstance(scale, Tensor):
        q = q * scale[:, None, :, None].to(q.dtype)
    elif scale != 1.0:
        q = q * scale
    if fused is None:
        fused = _fused_serves(q, dropout, grad)
    elif fused and not _fused_serves(q, dropout, grad):
        raise bad_value("fused", fused, "False (or None) with gradients, dropout, or a device and dtype other "
                        f"than {FUSED_DTYPES}")
    b, h, tq, _ = q.shape
    tk = k.shape[2]
    origin = k_pos[:, :1]  # (B,1)
    rotated: dict[int, Tensor] = {}  # maps sharing one key-position tensor share its rotation (DCA)
    keys = []
    for m, pos in enumerate(position_map.key_positions(k_pos, origin)):
        if id(pos) not in rotated:
            rotated[id(pos)] = _rotate_keys(scheme, k, pos, kept, m, ("rotated keys", position_map),
                                            source=append_only_buffer(k_pos))  # (B,Hkv,Tk,Dh)
        keys.append(rotated[id(pos)])
    q_maps = position_map.query_positions(q_pos, origin)  # per map (B,Tq)
    gpu = q.device.type != "cpu"
    if budget is None and gpu:
        budget = GPU_FUSED_BUDGET if fused else GPU_SCORE_BUDGET
    rows = chunk_rows(b, h, tq, tk, budget, GPU_MAX_ROWS if gpu and fused else MAX_ROWS)
    key_index = torch.arange(tk, device=q.device)
    out = []
    for start, end in query_chunks(q_pos[0], rows, position_map.period):
        select = position_map.select(q_pos[:, start:end], k_pos, origin)  # (B,C,Tk) int8
        if causal:
            query_index = torch.arange(tk - tq + start, tk - tq + end, device=q.device)
            select = select.masked_fill(key_index[None, None, :] > query_index[None, :, None], -1)
        queries = [_rotate_queries(scheme, q[:, :, start:end], p[:, start:end]) for p in q_maps]
        out.append(_merged_chunk(queries, keys, v, select, dropout, fused))
    return torch.cat(out, dim=2).to(dtype)


def _fused_serves(q: Tensor, dropout: float, grad: bool) -> bool:
    """The fused kernels' backward ignores the log-sum-exp that the merge differentiates, and they take no dropout."""
    return q.dtype in FUSED_DTYPES.get(q.device.type, ()) and dropout == 0.0 and not grad


def map_fused(call: Call) -> Tensor | None:
    """The dispatch's kernel map_fused: every map through a fused kernel; declines dropout, gradients, and devices
    and dtypes without one (float64 on CUDA goes on to map_eager). call.scheme is a posenc.position_map.MappedScheme."""
    if not _fused_serves(call.q, call.dropout, call.grad):
        return None
    scheme = call.scheme
    return mapped_attention(call.q, call.k, call.v, scheme.inner, scheme.position_map, call.q_pos, call.k_pos,
                            call.causal, fused=True, kept=call.kept)


def map_eager(call: Call) -> Tensor:
    """The dispatch's kernel map_eager: every map with its scores in memory (gradients, dropout, any device)."""
    scheme = call.scheme
    return mapped_attention(call.q, call.k, call.v, scheme.inner, scheme.position_map, call.q_pos, call.k_pos,
                            call.causal, call.dropout, fused=False, kept=call.kept)


def _merged_chunk(queries: list[Tensor], keys: list[Tensor], v: Tensor, select: Tensor, dropout: float,
                  fused: bool) -> Tensor:
    """queries per map (B,H,C,Dh), keys per map (B,Hkv,Tk,Dh), v (B,Hkv,Tk,Dh), select (B,C,Tk) -> (B,H,C,Dh)."""
    b, h, c, dh = queries[0].shape
    hkv = v.shape[1]
    g = h // hkv
    outs, lses = [], []
    for m, (q_m, k_m) in enumerate(zip(queries, keys, strict=True)):
        hit = select == m  # (B,C,Tk)
        cols = hit.any(dim=1).any(dim=0).nonzero()
        if cols.numel() == 0:
            continue
        lo, hi = int(cols[0]), int(cols[-1]) + 1  # the keys this map scores: one contiguous range
        q3 = q_m.reshape(b, hkv, g * c, dh)  # GQA without copying keys: g query heads share a key head
        for a, z, every_row in _segments(hit, lo, hi):
            allowed = None if every_row else hit[:, None, :, a:z].repeat(1, 1, g, 1)  # (B,1,g*C,K)
            if fused:
                out, lse = _map_fused(q3, k_m[:, :, a:z], v[:, :, a:z], allowed)
            else:
                out, lse = _map_eager(q3, k_m[:, :, a:z], v[:, :, a:z], allowed, dropout)
            outs.append(out)
            lses.append(lse)
    lse = torch.stack(lses)  # (M,B,Hkv,g*C)
    total = torch.logsumexp(lse, dim=0)
    weights = torch.exp(lse - total.masked_fill(total == float("-inf"), 0.0))  # 0 for a map with no key in a row
    merged = sum(w[..., None] * torch.where(w[..., None] > 0, o, 0.0) for w, o in zip(weights, outs, strict=True))
    return merged.view(b, h, c, dh)


def _segments(hit: Tensor, lo: int, hi: int) -> list[tuple[int, int, bool]]:
    """The key range [lo, hi) of one map cut into (start, end, every_row): the middle run of keys that every query
    of the chunk scores with this map needs no mask (most of a band's or a window's range: the fast unmasked
    kernel), the edges do. Parts of one map merge by log-sum-exp exactly as the maps do."""
    full = hit[:, :, lo:hi].all(dim=1).all(dim=0).nonzero()  # (n,1) keys every row scores here
    if full.numel() == 0:
        return [(lo, hi, False)]
    a, z = lo + int(full[0]), lo + int(full[-1]) + 1
    if z - a != full.numel():  # not one run (no method of ours does this): one masked range
        return [(lo, hi, False)]
    return [(x, y, every) for x, y, every in ((lo, a, False), (a, z, True), (z, hi, False)) if y > x]


def _map_fused(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None) -> tuple[Tensor, Tensor]:
    """One map through a fused kernel that returns the log-sum-exp: CUDA's memory-efficient one, else the CPU's
    flash one."""
    return (_map_fused_cuda if q.device.type == "cuda" else _map_fused_cpu)(q, k, v, allowed)


def _map_fused_cpu(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None) -> tuple[Tensor, Tensor]:
    """One map through the CPU flash kernel: q (B,Hkv,R,Dh), k/v (B,Hkv,K,Dh), allowed (B,1,R,K) or None (every
    key) -> softmax output (B,Hkv,R,Dh) and log-sum-exp (B,Hkv,R), -inf for a row with no key."""
    if allowed is None:
        out, lse = _FLASH(q, k, v, 0.0, False, scale=q.shape[-1] ** -0.5)[:2]
        return out, lse
    mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, float("-inf"))
    out, lse = _FLASH(q, k, v, 0.0, False, attn_mask=mask, scale=q.shape[-1] ** -0.5)
    return out, lse.masked_fill(~allowed.any(dim=-1), float("-inf"))  # the kernel reports 0 for an empty row


def _map_fused_cuda(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None) -> tuple[Tensor, Tensor]:
    """The same through CUDA's memory-efficient kernel. Its additive mask's rows must start 16-element aligned
    (what SDPA's own front end pads for), and its log-sum-exp may be padded past the rows."""
    bias = None
    if allowed is not None:
        b, _, rows, keys = allowed.shape
        bias = torch.full((b, 1, rows, -(-keys // 16) * 16), float("-inf"), dtype=q.dtype, device=q.device)
        bias = bias[..., :keys].masked_fill_(allowed, 0.0).expand(b, q.shape[1], rows, keys)
    out, lse = _EFFICIENT(q, k, v, bias, True, scale=q.shape[-1] ** -0.5)[:2]
    lse = lse[..., : q.shape[2]]
    if allowed is not None:  # a row with no key: weight 0 in the merge, whatever the kernel wrote
        lse = lse.masked_fill(~allowed.any(dim=-1), float("-inf"))
    return out, lse


def _map_eager(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, dropout: float) -> tuple[Tensor, Tensor]:
    """The same in plain operations (scores held): any device, dropout, the reference for _map_fused."""
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5  # (B,Hkv,R,K)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - lse.masked_fill(lse == float("-inf"), 0.0)[..., None])
    return (F.dropout(weights, dropout) if dropout > 0 else weights) @ v, lse
