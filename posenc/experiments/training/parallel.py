"""Independent units of work (a scheme x seed training, a task run) on every core: one spawned
process per core, one intra-op thread each (tiny models gain nothing from a second thread, and
spin-waiting threads on a shared core cost up to 50x). A unit's result depends on its arguments
only, so any number of workers gives the same results; they arrive in completion order."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

import torch

from posenc.checks import positive_int
from posenc.registry import import_plugins, plugin_modules

U = TypeVar("U")


def default_workers() -> int:
    """One process per core this process may use."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _worker_init(threads: int, plugins: list[str]) -> None:
    torch.set_num_threads(threads)
    import_plugins(plugins)  # a spawned process starts with the built-in registry: re-register user schemes


def run_units(function: Callable[[U], Any], units: Sequence[U], workers: int,
              on_done: Callable[[U, Any], None] | None = None) -> list[Any]:
    """[function(unit) for unit in units], on `workers` processes (1: in this process, in order).
    on_done(unit, result) runs in this process as each finishes (e.g. to save partial results). A
    failure or Ctrl-C cancels the units not started yet and re-raises."""
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
                             initializer=_worker_init, initargs=(threads, plugin_modules())) as pool:
        futures = {pool.submit(function, unit): index for index, unit in enumerate(units)}
        try:
            for future in as_completed(futures):
                done(futures[future], future.result())
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return results


__all__ = ["default_workers", "run_units"]
