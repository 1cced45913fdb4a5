"""Peak memory and time of one exact position-map attention call at SmolLM2-135M's shapes (H=9, Hkv=3, Dh=64):
    .venv/bin/python scripts/position_maps_memory.py T [method]
Prints the process's peak RSS before and after the call; dense attention would hold 9*T*T float32 scores."""

import resource
import sys
import time

import torch

import posenc
from posenc.nn.mapped_attention import SCORE_BUDGET, chunk_rows, mapped_attention
from posenc.registry import build_position_map

SPECS = {"self_extend": {"type": "self_extend", "group_size": 8, "window": 1024}, "dual_chunk": {"type": "dual_chunk"},
         "lm_infinite": {"type": "lm_infinite"}, "attention_sinks": {"type": "attention_sinks"}}
t, method = int(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "self_extend")
torch.set_num_threads(1)
rope = posenc.build("rope", posenc.Dims(576, 9, 64, 8192, True, 3), {"rotary_base": 100000.0})
position_map = build_position_map(SPECS[method], 8192)
q, k, v = torch.randn(1, 9, t, 64), torch.randn(1, 3, t, 64), torch.randn(1, 3, t, 64)
pos = torch.arange(t)[None]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
start = time.perf_counter()
with torch.no_grad():
    out = mapped_attention(q, k, v, rope, position_map, pos, pos)
seconds = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
print(f"{method} T={t}: {chunk_rows(1, 9, t, t)} query rows per chunk (budget {SCORE_BUDGET} scores); peak RSS "
      f"{before:.0f} MiB before, {after:.0f} MiB after (+{after - before:.0f}); dense scores would be "
      f"{9 * t * t * 4 / 2**20:.0f} MiB; {seconds:.1f} s on one thread")
