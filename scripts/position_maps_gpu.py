"""Time and peak GPU memory of one exact position-map attention call at SmolLM2-135M's shapes (H=9, Hkv=3,
Dh=64, float32 inside), fused (CUDA's memory-efficient kernel per map) and eager, against plain causal SDPA
on the same q, k, v (float32 and bfloat16):
    python scripts/position_maps_gpu.py [T ...]      (default 32768 65536; needs a CUDA device)
Each time is the median of 3 calls after one warm-up, the GPU waited for; one line per (T, method, path)."""

import statistics
import sys
import time
from functools import partial

import torch
import torch.nn.functional as F

import posenc
from posenc.nn.mapped_attention import mapped_attention
from posenc.registry import build_position_map

SPECS = {"self_extend": {"type": "self_extend", "group_size": 8, "window": 1024}, "dual_chunk": {"type": "dual_chunk"},
         "lm_infinite": {"type": "lm_infinite"}, "attention_sinks": {"type": "attention_sinks"}}
EAGER_UP_TO = 32768  # the eager form at 64k: minutes per call, and the point is made at 32k


def timed(call) -> tuple[float, float]:
    """(median seconds of 3 calls after a warm-up, peak GiB allocated during one call)."""
    call()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), torch.cuda.max_memory_allocated() / 2**30


def plain(q, k, v):
    """Causal SDPA with the key/value heads repeated: enable_gqa sends float32 to the math kernel, which holds
    (H, T, T) scores (9 GiB at 32k: out of memory in the first try on an H100)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)


def main(lengths: list[int]) -> None:
    rope = posenc.build("rope", posenc.Dims(576, 9, 64, 8192, True, 3), {"rotary_base": 100000.0}).cuda()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for t in lengths:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(1, h, t, 64, device="cuda", generator=g) for h in (9, 3, 3))
        pos = torch.arange(t, device="cuda")[None]
        with torch.no_grad():
            for dtype in (torch.float32, torch.bfloat16):
                s, gib = timed(plain(q.to(dtype), k.to(dtype), v.to(dtype)))
                print(f"T={t} plain causal SDPA {str(dtype)[6:]}: {s * 1e3:.1f} ms, peak {gib:.2f} GiB")
            for method, spec in SPECS.items():
                call = partial(mapped_attention, q, k, v, rope, build_position_map(spec, 8192), pos, pos)
                for fused in (True, False):
                    if not fused and t > EAGER_UP_TO:
                        continue
                    s, gib = timed(partial(call, fused=fused))
                    print(f"T={t} {method} {'fused' if fused else 'eager'}: {s * 1e3:.1f} ms, peak {gib:.2f} GiB")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [32768, 65536])
