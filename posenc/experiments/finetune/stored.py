"""The one reader of the files `posenc finetune` keeps (a unit's records.json, results.json), each checked as a
whole before anything is computed or rewritten from it: a hand-edited value ("range": "zero") is one line naming
the file, the place and what is allowed, never a TypeError from deep in the report nor a number in the results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from posenc.errors import bad_value

STATUSES = ("ok", "diverged")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bad(path: Path, where: str, value: Any, allowed: str) -> ValueError:
    shown = value if len(repr(value)) < 60 else "..."
    return bad_value(f"{path.name} {where}", shown, f"{allowed} ({path})")


def _lengths(path: Path, where: str, table: Any, check, allowed: str) -> dict[int, Any]:
    """{length (text in JSON): value} -> {int: value}, every value passing check."""
    if not isinstance(table, dict) or not all(isinstance(k, str) and k.isdigit() for k in table):
        raise _bad(path, where, table, "an object from lengths (whole numbers) to values")
    for key, value in table.items():
        if not check(value):
            raise _bad(path, f"{where}[{key}]", value, allowed)
    return {int(k): v for k, v in table.items()}


def record(path: Path, where: str, item: Any) -> dict[str, Any]:
    """One measurement: step, train_loss (null before any step), passkey accuracy and perplexity by length, range."""
    if not isinstance(item, dict):
        raise _bad(path, where, item, "an object (one measurement)")
    step, loss, reach = item.get("step"), item.get("train_loss"), item.get("range")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise _bad(path, f"{where}.step", step, "a whole number >= 0")
    if loss is not None and not _number(loss):
        raise _bad(path, f"{where}.train_loss", loss, "a number, or null before the first step")
    if not isinstance(reach, int) or isinstance(reach, bool) or reach < 0:
        raise _bad(path, f"{where}.range", reach, "a whole number of tokens >= 0")
    passkey = _lengths(path, f"{where}.passkey", item.get("passkey"), lambda v: _number(v) and 0 <= v <= 1,
                       "an accuracy from 0 to 1")
    ppl = _lengths(path, f"{where}.ppl", item.get("ppl"), lambda v: v is None or (_number(v) and not v < 1),
                   "a perplexity >= 1, or null")
    return item | {"passkey": passkey, "ppl": ppl}


def records(path: Path) -> list[dict[str, Any]]:
    """A unit's records.json (none yet: []), lengths back as ints."""
    if not path.is_file():
        return []
    items = _json(path)
    if not isinstance(items, list):
        raise _bad(path, "", type(items).__name__, "a list of measurements")
    return [record(path, f"[{i}]", item) for i, item in enumerate(items)]


def status(path: Path) -> dict[str, Any] | None:
    """A unit's unit.json (written when it diverged), or None."""
    if not path.is_file():
        return None
    data = _json(path)
    if not isinstance(data, dict) or data.get("status") not in STATUSES:
        raise _bad(path, "status", data.get("status") if isinstance(data, dict) else data, f"one of {STATUSES}")
    return data


def results(path: Path) -> tuple[list[dict[str, Any]], list[Any]]:
    """results.json's units (each with its records checked) and bases."""
    data = _json(path)
    if not isinstance(data, dict) or not isinstance(data.get("units"), list):
        raise _bad(path, "units", None if not isinstance(data, dict) else data.get("units"), "a list of units")
    units = []
    for i, unit in enumerate(data["units"]):
        where = f"units[{i}]"
        if not isinstance(unit, dict) or not isinstance(unit.get("method"), str) \
                or not isinstance(unit.get("seed"), int) or unit.get("status") not in STATUSES:
            raise _bad(path, where, unit, f"an object with method (a name), seed (an integer), status {STATUSES}")
        items = unit.get("records", [])
        if not isinstance(items, list):
            raise _bad(path, f"{where}.records", items, "a list of measurements")
        units.append(unit | {"records": [record(path, f"{where}.records[{j}]", r) for j, r in enumerate(items)]})
    bases = data.get("bases", [])
    if not isinstance(bases, list):
        raise _bad(path, "bases", bases, "a list")
    return units, bases


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise bad_value(path.name, str(path), f"a readable JSON file written by `posenc finetune` ({err})") from None


__all__ = ["record", "records", "results", "status"]
