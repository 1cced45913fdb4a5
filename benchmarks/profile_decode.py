"""Where a decode step's extra time goes for a scheme (the evidence behind BENCHMARKS.md's decode misses):
the median time per token against `none` on the decode benchmark's model, and cProfile's posenc functions
per token, by cumulative time.

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \
        .venv/bin/python -m benchmarks.profile_decode --scheme rope --context 4096
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

from benchmarks.bench_model import _decoder


def _median_ms(step, tokens: int) -> float:
    times = []
    for _ in range(tokens):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scheme", default="rope")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--rows", type=int, default=15, help="functions to show")
    args = parser.parse_args(argv)
    # The decode benchmark's model (4 layers, d_model 256, 8 heads); each step decodes one more token.
    steps = {name: _decoder(name, args.context, 2 * args.tokens + 8, 256, 4, 8) for name in ("none", args.scheme)}
    for step in steps.values():
        step()  # warm-up
    ms = {name: _median_ms(step, args.tokens // 2) for name, step in steps.items()}
    print(f"ms/token: none {ms['none']:.3f}, {args.scheme} {ms[args.scheme]:.3f} "
          f"(x{ms[args.scheme] / ms['none']:.3f}, +{1e3 * (ms[args.scheme] - ms['none']):.0f} us)")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.tokens // 2):
        steps[args.scheme]()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats("posenc", args.rows)
    print(f"\ncProfile of {args.tokens // 2} tokens ({args.scheme}; cProfile slows Python, so compare, do not add):")
    print("\n".join(line for line in out.getvalue().splitlines() if "posenc" in line or "ncalls" in line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
