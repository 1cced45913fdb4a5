"""The rows a task leaderboard has saved (results.json), read back when it is continued: a unit's rows
are saved all at once, so any row of a (scheme, task, seed) means that unit is done."""

from __future__ import annotations

import json
from pathlib import Path

from posenc.errors import bad_value
from posenc.experiments.tasks.run import Unit


def previous_rows(run_dir: Path, config: dict) -> list[dict]:
    """Rows (and diverged units) of earlier sessions in run_dir that this leaderboard asks for; [] when none."""
    results = run_dir / "results.json"
    if not results.is_file():
        return []
    try:
        data = json.loads(results.read_text(encoding="utf-8"))
        rows = [*data["rows"], *data.get("diverged", [])]  # diverged units are results: kept, not trained again
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise bad_value("run_dir", str(run_dir), f"a tasks run with readable results.json ({err})") from None
    b = config["leaderboard"]
    wanted = {(s, t, seed) for s in b["schemes"] for t in b["tasks"] for seed in b["seeds"]}
    return [row for row in rows if (row["scheme"], row["task"], row["seed"]) in wanted]


def units_in(rows: list[dict]) -> set[Unit]:
    """Runs already finished."""
    return {Unit(row["scheme"], row["task"], row["seed"]) for row in rows}
