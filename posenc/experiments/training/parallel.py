"""Independent units of work (a scheme x seed training, a task run) on every core: one spawned
process per core, one intra-op thread each (tiny models gain nothing from a second thread, and
spin-waiting threads on a shared core cost up to 50x). A unit's result depends on its arguments
only, so any number of workers gives the same results; they arrive in completion order."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

import torch

from posenc.registry import import_plugins, plugin_modules
from posenc.validators import positive_int

U = TypeVar("U")


def default_workers() -> int:
    """One process per core this process may use."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


PR_SET_PDEATHSIG = 1  # linux/prctl.h
WATCH_SECONDS = 1.0  # how often a worker looks whether the process that started it is still there


def _die_with(parent: int) -> None:
    """End this worker when `parent` dies, however it dies (SIGKILL included), so no orphan goes on
    writing into a run folder that a resumed run is writing too. Linux: the kernel sends SIGKILL
    (PR_SET_PDEATHSIG); everywhere: a thread that exits once the parent pid changes."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_SECONDS)
        os._exit(1)  # the parent died before prctl took effect, or this is not Linux

    threading.Thread(target=watch, name="posenc-parent-watch", daemon=True).start()


def _worker_init(threads: int, plugins: list[str], parent: int) -> None:
    _die_with(parent)
    torch.set_num_threads(threads)
    import_plugins(plugins)  # a spawned process starts with the built-in registry: re-register user schemes


def run_units(function: Callable[[U], Any], units: Sequence[U], workers: int,
              on_done: Callable[[U, Any], None] | None = None) -> list[Any]:
    """[function(unit) for unit in units], on `workers` processes (1: in this process, in order).
    on_done(unit, result) runs in this process as each finishes (e.g. to save partial results). A
    failure, Ctrl-C or SIGTERM (as Ctrl-C, posenc.stop_signals) cancels the units not started yet, stops those
    in flight and re-raises."""
    positive_int("workers", workers)
    results: list[Any] = [None] * len(units)

    def done(index: int, result: Any) -> None:
        results[index] = result
        if on_done is not None:
            on_done(units[index], result)

    if workers == 1 or len(units) <= 1:
        for index, unit in enumerate(units):
            done(index, function(unit))
        return results
    threads = max(1, default_workers() // workers)
    with ProcessPoolExecutor(min(workers, len(units)), mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_init, initargs=(threads, plugin_modules(), os.getpid())) as pool:
        futures = {pool.submit(function, unit): index for index, unit in enumerate(units)}
        try:
            for future in as_completed(futures):
                done(futures[future], future.result())
        except BaseException:
            workers = list((getattr(pool, "_processes", None) or {}).values())  # shutdown() forgets them
            pool.shutdown(wait=False, cancel_futures=True)
            _stop(workers)  # units in flight would be discarded anyway: do not wait for them to finish
            raise
    return results


GRACE_SECONDS = 30.0  # a worker's time to finish its step and save (training loops defer SIGTERM to the step's end)


def _stop(workers: list[Any]) -> None:
    """Stop the pool's worker processes: SIGTERM, GRACE_SECONDS to end (a training loop saves its step and stops),
    then SIGKILL. Without this, Ctrl-C or a time limit's SIGTERM waited for every unit in flight to finish, only to
    drop its result (seen: a GPU ladder killed by `timeout -k` with nothing saved; a subword compare whose workers,
    having saved their step, went on to evaluate). Files are written atomically, so a killed worker leaves none
    half-written, and a checkpointed unit resumes from its step."""
    for process in workers:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            process.terminate()
    deadline = time.monotonic() + GRACE_SECONDS
    for process in workers:
        with contextlib.suppress(OSError, ValueError, AttributeError, AssertionError):
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()


__all__ = ["default_workers", "run_units"]
