"""One query per head against runs of keys, each run scored by its own query and key table, in one native call
(posenc/nn/csrc/map_decode.cpp): a decode step under a position map (mapped_decode.map_decode), where map m's
rotated query meets the keys as map m rotates them, over the runs of keys the map scores, with one softmax over
every run. Notation: B, Hkv, Tk, Dh as in attention.py; G query heads per key/value head; M maps."""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from posenc.nn import native

_I64x3 = ctypes.c_int64 * 3
BLOCK = 1024  # keys per product: a run of 3k keys is three calls, the scores of a block stay in L1/L2


class RunsArgs(ctypes.Structure):  # mirrors csrc/map_decode.cpp
    _fields_ = [("q", ctypes.c_void_p), ("keys", ctypes.c_void_p), ("key_strides", ctypes.c_void_p),
                ("v", ctypes.c_void_p), ("v_strides", _I64x3), ("runs", ctypes.c_void_p),
                *((n, ctypes.c_int64) for n in ("n_runs", "B", "Hkv", "G", "D")), ("scale", ctypes.c_float),
                ("out", ctypes.c_void_p), ("block", ctypes.c_int64), ("threads", ctypes.c_int32)]


def can_run(queries: Tensor, tables: list[Tensor], v: Tensor) -> bool:
    """float32 on the CPU, every last dim contiguous, the kernels built."""
    return (queries.device.type == "cpu" and all(t.dtype == torch.float32 and t.stride(-1) == 1
                                                 for t in (queries, v, *tables)) and native.has_gemm())


def attend_runs(queries: Tensor, tables: list[Tensor], v: Tensor, runs: list[tuple[int, int, int, int]],
                scale: float) -> Tensor:
    """queries (M,B,Hkv,G,Dh) contiguous, tables: key tables (B,Hkv,Tk,Dh), v (B,Hkv,Tk,Dh), runs: (map, key table,
    first key, end key), scale: multiplies every score -> (B,Hkv,G,Dh): softmax over every run's scores of
    scale * queries[map] . tables[table][first:end], times the values of those keys. Only where can_run()."""
    m, b, hkv, g, d = queries.shape
    for name, t in (("v", v), *((f"key table {i}", t) for i, t in enumerate(tables))):
        if t.dim() != 4 or tuple(t.shape[:2]) != (b, hkv) or t.shape[3] != d:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected (B={b}, Hkv={hkv}, Tk, Dh={d})")
    for run in runs:
        mp, table, first, end = run
        if not (0 <= mp < m and 0 <= table < len(tables) and 0 <= first < end <= min(v.shape[2],
                                                                                     tables[table].shape[2])):
            raise ValueError(f"run {run} (map, key table, first, end) is outside {m} maps, {len(tables)} key tables "
                             f"and {v.shape[2]} keys")
    queries = queries.contiguous()
    out = torch.empty(b, hkv, g, d)
    pointers = (ctypes.c_void_p * len(tables))(*(t.data_ptr() for t in tables))
    strides = native.int64s(*(s for t in tables for s in t.stride()[:3]))
    flat_runs = native.int64s(*(x for run in runs for x in run))
    args = RunsArgs(q=queries.data_ptr(), keys=ctypes.addressof(pointers), key_strides=ctypes.addressof(strides),
                    v=v.data_ptr(), v_strides=_I64x3(*v.stride()[:3]), runs=ctypes.addressof(flat_runs),
                    n_runs=len(runs), B=b, Hkv=hkv, G=g, D=d, scale=scale, out=out.data_ptr(), block=BLOCK,
                    threads=native.threads())
    native.library().posenc_attention_runs(ctypes.addressof(args))
    return out


__all__ = ["attend_runs", "can_run"]
