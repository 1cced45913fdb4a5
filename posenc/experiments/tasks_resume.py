"""Resume a task leaderboard from its results.json: keep finished runs whose settings still match."""

from __future__ import annotations

import json
from pathlib import Path

from posenc.errors import bad_value
from posenc.experiments.tasks_run import Unit

# Lists that only choose which runs exist; changing them adds or drops runs, it does not void old ones.
RUN_LISTS = ("schemes", "tasks", "seeds")


def comparable(settings: dict) -> dict:
    model = {k: v for k, v in settings["model"].items() if k != "position_embedding_type"}
    kept = {**{k: v for k, v in settings.items() if k not in RUN_LISTS}, "model": model}
    return json.loads(json.dumps(kept, default=str))  # as stored: tuples read back as lists


def previous_rows(path: Path, settings: dict) -> list[dict]:
    """Rows of earlier runs in `path` that this leaderboard asks for; [] when there is no file."""
    if not path.exists():
        return []
    stored = json.loads(path.read_text(encoding="utf-8"))
    if comparable(stored["settings"]) != comparable(settings):
        raise bad_value("--out", str(path.parent), "a new folder, or one whose results.json has the same "
                        "settings apart from --schemes/--tasks/--seeds")
    wanted = {(s, t, seed) for s in settings["schemes"] for t in settings["tasks"] for seed in settings["seeds"]}
    return [row for row in stored["rows"] if (row["scheme"], row["task"], row["seed"]) in wanted]


def units_in(rows: list[dict]) -> set[Unit]:
    """Runs already finished: a run's rows are saved all at once, so any row means it is done."""
    return {Unit(row["scheme"], row["task"], row["seed"]) for row in rows}
