"""The one owner of the results.json format of the scheme x seed studies (compare, and the ladder, whose units
carry their size): what a unit holds, how it is saved and read back, and what a run of units ends with. JSON
keys are strings; a unit's per-length, per-offset and per-size tables are keyed by ints everywhere else, so they
are restored here, once, for every reader."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from posenc.atomic_files import write_json
from posenc.errors import RunFailed, bad_value
from posenc.experiments import report_writer
from posenc.experiments.evaluation.perplexity import BEYOND_TABLE, NOT_FINITE

DIVERGED = "diverged"  # a training loss that stopped being finite: the unit has no results
RESULTS = "results.json"
LABELS = (BEYOND_TABLE, NOT_FINITE)  # what a cell holds instead of a number (evaluation.perplexity and .shift)
INT_KEYED = ("ppl", "bpb", "shift_loss_change", "task_accuracy")  # length multiplier (ppl, bpb), offset, problem size


def save_units(run_dir: Path, units: list[dict[str, Any]]) -> Path:
    """The units finished so far (a crash keeps them); the report rewrites the file with its tables too."""
    return write_json(Path(run_dir) / RESULTS, {"units": units})


def load_units(run_dir: Path, asked: Any = None, sizes: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The saved units, checked as a whole (a hand-edited file included): one line naming the file and
    what is wrong, never a traceback from deep in the report. With `asked` (the run's compare section), each
    unit is one the run asked for, and none is there twice (a duplicate would count as a seed); with `sizes`
    (a ladder's), each unit's size is one of them (a unit of another size would be dropped without a word)."""
    path = Path(run_dir) / RESULTS
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise bad_value("results", str(path), f"a readable results.json of `posenc compare` ({err})") from None
    units = data.get("units") if isinstance(data, dict) else None
    if not isinstance(units, list):
        raise bad_value("results", str(path), "a JSON object whose 'units' is a list (of scheme x seed results)")
    checked = [_checked_unit(path, i, unit) for i, unit in enumerate(units)]
    seen: set[tuple] = set()
    for i, unit in enumerate(checked):
        key = (unit.get("size"), unit["scheme"], unit["seed"])  # a ladder's units carry their size
        if key in seen:
            raise bad_value(f"results units[{i}]", f"{unit['scheme']} seed {unit['seed']}",
                            f"each (scheme, seed) once ({path})")
        seen.add(key)
        if asked is not None and (unit["scheme"] not in asked.schemes or unit["seed"] not in asked.seeds):
            raise bad_value(f"results units[{i}]", f"{unit['scheme']} seed {unit['seed']}", f"a unit of this run: "
                            f"compare.schemes {list(asked.schemes)} x seeds {list(asked.seeds)} ({path})")
        if sizes is not None and unit.get("size") not in sizes:
            raise bad_value(f"results units[{i}].size", unit.get("size"), f"one of ladder.sizes {list(sizes)} "
                                                                          f"({path})")
    return checked


def _checked_unit(path: Path, index: int, unit: Any) -> dict[str, Any]:
    def bad(what: str):
        return bad_value(f"results units[{index}]", unit if len(repr(unit)) < 80 else "...", f"{what} ({path})")

    if not isinstance(unit, dict):
        raise bad("an object")
    if not isinstance(unit.get("scheme"), str) or not isinstance(unit.get("seed"), int) \
            or unit.get("status") not in ("ok", DIVERGED):
        raise bad(f"an object with scheme (a name), seed (an integer) and status ('ok' or '{DIVERGED}')")
    tables = {}
    for key in INT_KEYED:
        if key not in unit:
            continue
        table = unit[key]
        if not isinstance(table, dict) or not all(isinstance(k, str) and k.lstrip("-").isdigit() for k in table) \
                or not all(v is None or isinstance(v, (int, float, str)) for v in table.values()):
            raise bad(f"{key} as an object from integers to numbers or labels")
        labels = [v for v in table.values() if isinstance(v, str) and v not in LABELS]
        if labels:
            raise bad(f"{key} values that are numbers or one of {', '.join(LABELS)} (not {labels[0]!r})")
        if key == "ppl" and any(isinstance(v, (int, float)) and v <= 0 for v in table.values()):
            raise bad(f"ppl values above 0 (a perplexity is exp of a loss; not {min(table.values(), key=_number)})")
        tables[key] = {int(k): (math.nan if v is None else v) for k, v in table.items()}
    for key in ("final_train_loss", "shift_dloss", "seconds", "params"):
        if key in unit and not (unit[key] is None or isinstance(unit[key], (int, float)) or unit[key] in LABELS):
            raise bad(f"{key} as a number")
    if unit["status"] == "ok" and "ppl" not in unit:
        raise bad("a finished unit with its ppl table")
    return {**unit, **tables}


def _number(v: Any) -> float:
    return v if isinstance(v, (int, float)) else math.inf  # labels and None sort last


def failed(units: list[dict[str, Any]]) -> list[str]:
    """`scheme seed N` of every unit whose model or task model diverged."""
    return [f"{u['scheme']} seed {u['seed']}" for u in units if DIVERGED in (u["status"], u.get("task_status"))]


def finished(units: list, path: Path, files: list) -> int:
    """Print where the run and its report are; a diverged model fails the command (compare and ladder alike)."""
    print(f"run folder: {path}\nreport:     {files[-1]}")
    if failed(units):
        raise RunFailed(f"{', '.join(failed(units))} diverged (reported as '{DIVERGED}', with no numbers); "
                        f"the other models' results are in {path}")
    return 0


def report_saved(run_dir: Path, cfg: Any, report: Any, wall_seconds: float, sizes: tuple[str, ...] | None = None) \
        -> None:
    """The report of the units saved so far (a stopped run), marked incomplete; nothing when none finished."""
    if (Path(run_dir) / RESULTS).is_file():
        units = load_units(run_dir, cfg.compare, sizes)
        report_writer.write(run_dir, report(units, cfg, wall_seconds), echo=False)
