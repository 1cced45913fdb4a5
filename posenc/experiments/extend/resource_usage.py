"""Wall time, CPU time and peak resident memory of a block of work, on CPU where torch keeps no
allocator statistics. CPU seconds stay meaningful on a shared machine, where wall time does not.

Linux lets a process reset its high-water mark (writing 5 to /proc/self/clear_refs resets
VmHWM, since Linux 4.0), so the peak is that of the block alone and includes what torch's
kernels allocate internally. Elsewhere we fall back to ru_maxrss, the peak since the process
started, and say so (`scoped` is False).
"""

from __future__ import annotations

import re
import resource
import sys
import time
from pathlib import Path
from types import TracebackType

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_bytes(field: str) -> int | None:
    try:
        found = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def _reset_high_water_mark() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def _max_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


class PeakMemory:
    """with PeakMemory() as mem: work()  ->  mem.peak_bytes, mem.start_bytes, mem.scoped, mem.seconds,
    mem.cpu_seconds (this process, all threads); where CUDA is in use, also mem.gpu_peak_bytes (torch's
    allocator, this block alone), the GPU's work waited for before the clocks stop."""

    def __init__(self) -> None:
        self.start_bytes = self.peak_bytes = 0
        self.gpu_peak_bytes: int | None = None
        self.scoped = False
        self.seconds = self.cpu_seconds = 0.0

    def __enter__(self) -> PeakMemory:
        self._gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
        if self._gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.scoped = _reset_high_water_mark() and _status_bytes("VmHWM") is not None
        self.start_bytes = _status_bytes("VmRSS") or _max_rss_bytes()
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if self._gpu:
            torch.cuda.synchronize()
            self.gpu_peak_bytes = torch.cuda.max_memory_allocated()
        self.seconds, self.cpu_seconds = time.perf_counter() - self._wall, time.process_time() - self._cpu
        hwm = _status_bytes("VmHWM") if self.scoped else None
        self.peak_bytes = hwm if hwm is not None else _max_rss_bytes()

    def as_dict(self) -> dict[str, float | bool]:
        gib = 2.0**30
        out = {"seconds": self.seconds, "cpu_seconds": self.cpu_seconds, "peak_rss_gib": self.peak_bytes / gib,
               "start_rss_gib": self.start_bytes / gib, "scoped_to_block": self.scoped}
        return out if self.gpu_peak_bytes is None else out | {"peak_gpu_gib": self.gpu_peak_bytes / gib}
