"""RoPE on q and k: posenc vs the peers vs the memory-copy floor (cloning the same bytes)."""

from __future__ import annotations

import torch

from benchmarks import peers
from benchmarks.timing import median_seconds, ratio
from posenc.rotary.rope import RoPE
from posenc.scheme import Dims


def rope_rows(shapes: list[tuple[int, int, int, int]], repeats: int) -> list[dict]:
    rows = []
    for b, h, t, d in shapes:
        g = torch.Generator().manual_seed(0)
        q, k = torch.randn(b, h, t, d, generator=g), torch.randn(b, h, t, d, generator=g)
        pos = torch.arange(t).expand(b, t)
        ours = RoPE(Dims(h * d, h, d, t))
        candidates = {
            "copy floor": lambda q=q, k=k: (q.clone(), k.clone()),
            # positions are new tensors each call, as in a forward: the per-forward table is rebuilt
            "posenc": lambda q=q, k=k, pos=pos, ours=ours: ours.rotate(q, k, pos.clone(), pos.clone()),
            "transformers": peers.transformers_peer(d),
            "torchtune": peers.torchtune_peer(d, t),
            "rotary-embedding-torch": peers.rotary_embedding_torch_peer(d),
        }
        times = {}
        with torch.no_grad():
            for name, fn in candidates.items():
                if fn is None:
                    continue
                call = fn if name in ("copy floor", "posenc") else (lambda fn=fn, q=q, k=k, pos=pos: fn(q, k, pos))
                times[name] = median_seconds(call, repeats)
        for name, seconds in times.items():
            rows.append({"B": b, "H": h, "T": t, "Dh": d, "impl": name, "ms": 1e3 * seconds,
                         "x copy": ratio(seconds, times["copy floor"]), "x posenc": ratio(seconds, times["posenc"])})
    return rows
