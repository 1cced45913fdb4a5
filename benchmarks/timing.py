"""Timing and memory helpers: medians of repeats after warm-up; peak memory as the rise of this
process's resident high-water mark during the call (Linux: reset through /proc/self/clear_refs)."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable

import torch


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def peak_bytes(fn: Callable[[], object]) -> int | None:
    """Extra resident memory at the peak of fn(), or None where the kernel cannot reset the peak."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
    except OSError:
        return None
    before = _status_kib("VmRSS:")
    result = fn()
    peak = _status_kib("VmHWM:")
    del result
    return max(0, peak - before) * 1024


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def threads() -> int:
    return torch.get_num_threads()
