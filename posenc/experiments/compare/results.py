"""The one owner of compare's results.json format: what a unit (scheme x seed) holds, and how it is
saved and read back. JSON keys are strings; a unit's per-length, per-offset and per-size tables
are keyed by ints everywhere else, so they are restored here, once, for every reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from posenc.atomic_files import write_json

DIVERGED = "diverged"  # a training loss that stopped being finite: the unit has no results
RESULTS = "results.json"
INT_KEYED = ("ppl", "shift_loss_change", "task_accuracy")  # length multiplier, offset, problem size


def save_units(run_dir: Path, units: list[dict[str, Any]]) -> Path:
    """The units finished so far (a crash keeps them); the report rewrites the file with its tables too."""
    return write_json(Path(run_dir) / RESULTS, {"units": units})


def load_units(run_dir: Path) -> list[dict[str, Any]]:
    data = json.loads((Path(run_dir) / RESULTS).read_text(encoding="utf-8"))
    return [{**unit, **{key: {int(k): v for k, v in unit[key].items()} for key in INT_KEYED if key in unit}}
            for unit in data["units"]]


def failed(units: list[dict[str, Any]]) -> list[str]:
    """`scheme seed N` of every unit whose model or task model diverged."""
    return [f"{u['scheme']} seed {u['seed']}" for u in units if DIVERGED in (u["status"], u.get("task_status"))]
