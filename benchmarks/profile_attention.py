"""Where the time goes in biased attention at T=4096 (the evidence behind BENCHMARKS.md's misses):
torch.profiler's top operators for posenc's default path vs plain causal SDPA.

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \
        .venv/bin/python -m benchmarks.profile_attention --scheme alibi --seq-len 4096
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.bench_attention import _posenc_path, _scheme


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scheme", default="alibi")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--rows", type=int, default=12, help="operators to show")
    args = parser.parse_args(argv)
    t, heads, head_dim = args.seq_len, 8, 64
    q, k, v = (torch.randn(1, heads, t, head_dim) for _ in range(3))
    pos = torch.arange(t)[None]
    scheme = _scheme(args.scheme, heads, head_dim, t)
    runs = {"sdpa (no positions)": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
            f"posenc {args.scheme}": lambda: _posenc_path(scheme, q, k, v, pos)}
    with torch.no_grad():
        for name, fn in runs.items():
            fn()  # warm-up
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fn()
            print(f"\n## {name}, T={t}\n")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
