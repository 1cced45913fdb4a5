"""Peak memory of Shaw et al.'s attention: the paper's (T,T,Dh) tensors vs posenc's gather/scatter path.

CPU has no max_memory_allocated, so a TorchDispatchMode watches every tensor an op returns and
tracks (a) the largest one and (b) the peak of live bytes (unique storages still referenced),
which is what the allocator must hold at once. Inference (no_grad), float32.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.shaw_memory --seq-len 1024
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.memory import MemoryWatch
from posenc.content.shaw import Shaw
from posenc.nn.attention import attend_eager
from posenc.scheme import Dims


def naive(q, k, v, pos, scheme: Shaw):
    """Eq. 3-5 literally, with a^K and a^V as (B,T,T,Dh) tensors."""
    clip = scheme.max_relative_position
    index = (pos[:, None, :] - pos[:, :, None]).clamp(-clip, clip) + clip  # (B,T,T)
    a_k = scheme.key_table[index]  # (B,T,T,Dh)
    scores = (q @ k.transpose(-1, -2) + torch.einsum("bhmd,bmnd->bhmn", q, a_k)) * q.shape[-1] ** -0.5
    del a_k
    scores = scores.masked_fill(pos[:, None, None, :] > pos[:, None, :, None], float("-inf"))
    weights = scores.softmax(-1)
    del scores
    a_v = scheme.value_table[index]  # (B,T,T,Dh)
    return weights @ v + torch.einsum("bhmn,bmnd->bhmd", weights, a_v)


def efficient(q, k, v, pos, scheme: Shaw):
    out, weights = attend_eager(q, k, v, scheme.bias(pos, pos, q, k), causal=True)
    return out + scheme.mix_values(weights, pos, pos)


def measure(fn, *args) -> MemoryWatch:
    with torch.no_grad(), MemoryWatch() as watch:
        fn(*args)
    return watch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--clip", type=int, default=16)
    a = parser.parse_args()
    torch.manual_seed(0)
    scheme = Shaw(Dims(a.heads * a.head_dim, a.heads, a.head_dim, a.seq_len), shaw_max_relative_position=a.clip)
    q, k, v = torch.randn(3, 1, a.heads, a.seq_len, a.head_dim).unbind(0)
    pos = torch.arange(a.seq_len)[None]
    with torch.no_grad():
        diff = (naive(q, k, v, pos, scheme) - efficient(q, k, v, pos, scheme)).abs().max().item()
    mib = 2.0**20
    print(f"T={a.seq_len} H={a.heads} Dh={a.head_dim} k={a.clip} float32 B=1; max |naive - efficient| = {diff:.2e}")
    for name, fn in (("naive (T,T,Dh)", naive), ("efficient", efficient)):
        w = measure(fn, q, k, v, pos, scheme)
        print(f"{name:16s} largest tensor {w.largest / mib:8.1f} MiB   peak live {w.peak / mib:8.1f} MiB")


if __name__ == "__main__":
    main()
