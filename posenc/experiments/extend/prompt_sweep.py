"""The loop both prompt sweeps share (passkey.py, ruler_sweep.py): every method x cell, one record per prompt, saved
as it finishes. A cell already in the run's state (a resumed run) is kept as it is, and a method that computes at a
cell's length what a method already run computed (dynamic = none inside the trained context; a map inside its
plain_within) reuses that record, marked `shared_with`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posenc.experiments.extend.config import ExtendConfig
from posenc.experiments.extend.model import computation_key, plain_model, sweep_methods, use_method
from posenc.experiments.extend.progress import RunState
from posenc.experiments.extend.resource_usage import PeakMemory
from posenc.models.llama import Llama

Record = dict[str, Any]


def sweep_prompts(cfg: ExtendConfig, model: Llama, task: str, cells: list[tuple], length_of: Callable[[tuple], int],
                  kept: dict[str, Record], cell_id: Callable[..., str],
                  ask: Callable[[tuple], tuple[Record, PeakMemory]], save: Callable[[Record], None], state: RunState,
                  progress: Any) -> None:
    """ask(cell) -> (record without the method, its usage) for each method and cell not in kept (cell_id(method,
    *cell) -> record); save(record) stores each record made or shared."""
    answered: dict[tuple, Record] = {}  # (computation key, *cell) -> record
    for method in sweep_methods(model, cfg):
        for cell in cells:
            length = length_of(cell)
            same = (computation_key(model, method, length), *cell)
            done = kept.get(cell_id(method.name, *cell))
            if done is not None:
                answered.setdefault(same, done)
                continue
            twin = answered.get(same)
            if twin is not None:
                record = {**twin, "method": method.name, "shared_with": twin.get("shared_with", twin["method"])}
            else:
                progress.set_description(" ".join(map(str, (task, method.name, *cell[:-1]))))  # the cell less its trial
                use_method(model, method, length)
                record, usage = ask(cell)
                record["method"] = method.name
                state.forward_done(task, length, usage)
                progress.update(length)
            answered[same] = record
            save(record)
    plain_model(model)


__all__ = ["sweep_prompts"]
