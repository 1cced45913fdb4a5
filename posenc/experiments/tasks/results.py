"""The one owner of a task leaderboard's results.json: its rows {scheme, task, seed, length, accuracy} (a split
task's also name their split), the units that diverged, and which units a run asked for and holds. Read back
by a continued run and by `posenc report`, checked as a whole (a hand-edited file included) before anything
is trained or rewritten: one line naming the file, the place and what is allowed. A unit's rows are saved all
at once, so any row of a (scheme, task, seed) means that unit is done."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from posenc.errors import bad_value
from posenc.experiments.tasks.run import DIVERGED, Unit

RESULTS = "results.json"


def asked_units(config: dict) -> list[Unit]:
    """Every (scheme, task, seed) the run's leaderboard asks for, in the order the options name them."""
    b = config["leaderboard"]
    return [Unit(s, t, seed) for s in b["schemes"] for t in b["tasks"] for seed in b["seeds"]]


def not_run(rows: list[dict], config: dict) -> list[Unit]:
    """The units the run asked for that hold no row (a stopped run): never reported as measured or diverged."""
    held = units_in(rows)
    return [unit for unit in asked_units(config) if unit not in held]


def read_rows(run_dir: Path, config: dict) -> list[dict]:
    """The measured rows and diverged units saved in run_dir (checked whole), of units `config` asks for;
    [] when there is no results.json yet."""
    path = Path(run_dir) / RESULTS
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise bad_value("results", str(path), f"a readable results.json of `posenc tasks` ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) \
            or not isinstance(data.get("diverged", []), list):
        raise bad_value("results", str(path), "a JSON object whose 'rows' (and 'diverged') are lists")
    rows = [_checked_row(path, f"rows[{i}]", row) for i, row in enumerate(data["rows"])]
    lost = [_checked_diverged(path, f"diverged[{i}]", row) for i, row in enumerate(data.get("diverged", []))]
    _check_each_once(path, rows, lost)
    wanted = set(asked_units(config))
    return [row for row in [*rows, *lost] if _unit(row) in wanted]


def _checked_row(path: Path, where: str, row: Any) -> dict:
    def bad(what: str):
        return bad_value(f"results {where}", row if len(repr(row)) < 80 else "...", f"{what} ({path})")

    if not isinstance(row, dict) or not _names_a_unit(row):
        raise bad("an object with scheme and task (names) and seed (an integer >= 0)")
    length, accuracy = row.get("length"), row.get("accuracy")
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise bad("a length (an integer >= 1)")
    if not isinstance(accuracy, (int, float)) or isinstance(accuracy, bool) or not 0.0 <= accuracy <= 1.0 \
            or math.isnan(accuracy):
        raise bad("an accuracy in [0, 1]")
    if "split" in row and not (isinstance(row["split"], str) and row["split"]):
        raise bad("a split name")
    if row.get("status", "ok") != "ok":
        raise bad(f"a measured row (a diverged unit is listed under 'diverged', status '{DIVERGED}')")
    return row


def _checked_diverged(path: Path, where: str, row: Any) -> dict:
    if not isinstance(row, dict) or not _names_a_unit(row) or row.get("status") != DIVERGED:
        raise bad_value(f"results {where}", row if len(repr(row)) < 80 else "...", f"an object with scheme, task, "
                        f"seed and status '{DIVERGED}' ({path})")
    return row


def _names_a_unit(row: dict) -> bool:
    seed = row.get("seed")
    return (isinstance(row.get("scheme"), str) and bool(row["scheme"]) and isinstance(row.get("task"), str)
            and bool(row["task"]) and isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0)


def _check_each_once(path: Path, rows: list[dict], lost: list[dict]) -> None:
    """A test size once per unit (and split), and a diverged unit with no measured rows."""
    seen: set[tuple] = set()
    for i, row in enumerate(rows):
        key = (row["scheme"], row["task"], row["seed"], row.get("split"), row["length"])
        if key in seen:
            raise bad_value(f"results rows[{i}]", row, f"each unit's test size once ({path})")
        seen.add(key)
    measured = units_in(rows)
    for i, row in enumerate(lost):
        if _unit(row) in measured:
            raise bad_value(f"results diverged[{i}]", row, f"a unit with no measured rows ({path})")


def _unit(row: dict) -> Unit:
    return Unit(row["scheme"], row["task"], row["seed"])


def units_in(rows: list[dict]) -> set[Unit]:
    """Runs already finished (measured or diverged)."""
    return {_unit(row) for row in rows}


# The name a continued run read its rows by before this module checked them.
previous_rows = read_rows
