"""Resume a task leaderboard from its folder: keep finished runs when the settings that shape
their numbers are the same (only which schemes, tasks and seeds run may change)."""

from __future__ import annotations

import json
from pathlib import Path

from posenc.errors import bad_value
from posenc.experiments.runs import manifest
from posenc.experiments.tasks.config import NOT_RESULT_KEYS
from posenc.experiments.tasks.run import Unit

HINT = "only leaderboard.schemes, .tasks, .seeds, .jobs and .progress may change; use a new folder for the rest"


def previous_rows(run_dir: Path, config: dict) -> list[dict]:
    """Rows of earlier runs in run_dir that this leaderboard asks for; [] for a new or empty folder."""
    stored = manifest.read(run_dir)
    if stored is None:
        if not manifest.is_empty(run_dir):
            names = ", ".join(sorted(p.name for p in run_dir.iterdir())[:5])
            raise bad_value("run_dir", str(run_dir), f"a new or empty folder, or a posenc tasks run (this one holds "
                                                     f"files posenc did not write: {names})")
        return []
    manifest.check_same_run(run_dir, stored, "tasks", config, NOT_RESULT_KEYS, HINT)
    results = run_dir / "results.json"
    if not results.is_file():
        return []
    try:
        rows = json.loads(results.read_text(encoding="utf-8"))["rows"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise bad_value("run_dir", str(run_dir), f"a tasks run with readable results.json ({err})") from None
    b = config["leaderboard"]
    wanted = {(s, t, seed) for s in b["schemes"] for t in b["tasks"] for seed in b["seeds"]}
    return [row for row in rows if (row["scheme"], row["task"], row["seed"]) in wanted]


def units_in(rows: list[dict]) -> set[Unit]:
    """Runs already finished: a run's rows are saved all at once, so any row means it is done."""
    return {Unit(row["scheme"], row["task"], row["seed"]) for row in rows}
