"""Timing: medians of repeats after warm-up, and ratios measured side by side (memory: benchmarks/memory.py)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_seconds(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds per function, measured in rounds that call every function once: a slow spell of the
    machine lands on every contender alike, so ratios between them stay fair."""
    return {name: statistics.median(t) for name, t in interleaved_times(fns, repeats, warmup).items()}


def interleaved_times(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 2) -> dict[str, list[float]]:
    """Seconds of every call per function, in rounds that call every function once (interleaved_seconds)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def ratio_spread(times: list[float], base: list[float]) -> tuple[float, float, float]:
    """The ratio of two functions timed in the same rounds: (median, 25th, 75th percentile) of the per-round ratios,
    so a target is judged against the spread it has, not one median."""
    ratios = sorted(t / b for t, b in zip(times, base, strict=True))
    low, middle, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return middle, low, high


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")
