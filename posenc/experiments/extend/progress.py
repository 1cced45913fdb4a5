"""What an extend run has finished (progress.json), saved after every step (atomically) so a crashed or
stopped run resumes where it stopped: `posenc extend --resume RUN_DIR`. Its wall time is the run's
(run.json, runs.rule)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posenc.atomic_files import write_json
from posenc.errors import bad_value
from posenc.experiments.extend.resource_usage import PeakMemory

STATE_FILE = "progress.json"


def cell_id(method: str, length: int, depth: float, trial: int) -> str:
    return f"{method}|{length}|{depth:g}|{trial}"


def ruler_cell_id(method: str, task: str, length: int, trial: int) -> str:
    return f"{method}|{task}|{length}|{trial}"


def _named_method(row: dict[str, Any]) -> dict[str, Any]:
    """A row saved before extend compared methods names its row `scaling`: the same thing."""
    return {"method": row["scaling"], **{k: v for k, v in row.items() if k != "scaling"}} if "scaling" in row else row


class RunState:
    def __init__(self, run_dir: Path, on_save: Callable[[], None] | None = None) -> None:
        self.run_dir, self.on_save = run_dir, on_save  # on_save: e.g. record the run's wall time
        self.ppl: dict[str, dict[str, Any]] = {}  # method -> row
        self.passkey: dict[str, dict[str, Any]] = {}  # cell_id -> record
        self.ruler: dict[str, dict[str, Any]] = {}  # ruler_cell_id -> record
        self.forwards: list[dict[str, Any]] = []  # time and peak memory of every forward
        self.machine: dict[str, Any] = {}  # model, trained length, device, torch: what `posenc report` needs again
        self.tuning: dict[str, dict[str, Any]] = {}  # map -> {length, points, chosen} (extend/tuning.py)

    @classmethod
    def load(cls, run_dir: Path, on_save: Callable[[], None] | None = None) -> RunState:
        state = cls(run_dir, on_save)
        path = run_dir / STATE_FILE
        if path.is_file():
            try:  # checked as a whole: a hand-edited file is one line naming it, never a traceback
                saved = json.loads(path.read_text(encoding="utf-8"))
                if not (isinstance(saved, dict) and isinstance(saved.get("ppl"), dict)
                        and isinstance(saved.get("passkey"), dict) and isinstance(saved.get("forwards"), list)
                        and isinstance(saved.setdefault("ruler", {}), dict)  # none before extend ran RULER
                        and isinstance(saved.setdefault("machine", {}), dict)  # none before it was recorded
                        and isinstance(saved.setdefault("tuning", {}), dict)  # none before extend tuned options
                        and all(isinstance(row, dict) for row in [*saved["ppl"].values(), *saved["passkey"].values(),
                                                                  *saved["ruler"].values()])):
                    raise ValueError("an object with ppl {method: row}, passkey {cell: record} and forwards [...]")
                _check_rows(saved)
                state.ppl = {name: _int_keys(_named_method(row)) for name, row in saved["ppl"].items()}
            except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as err:
                raise bad_value("progress", str(path), f"an extend progress file ({err}); restore it, or remove "
                                                       "it to start the run's work again") from None
            state.passkey = {cell: _named_method(record) for cell, record in saved["passkey"].items()}
            state.ruler, state.forwards, state.machine = saved["ruler"], saved["forwards"], saved["machine"]
            state.tuning = saved["tuning"]
        return state

    def save(self) -> None:
        if self.on_save is not None:  # first: a saved step's time is always recorded
            self.on_save()
        write_json(self.run_dir / STATE_FILE, {"ppl": self.ppl, "passkey": self.passkey, "ruler": self.ruler,
                                               "forwards": self.forwards, "machine": self.machine,
                                               "tuning": self.tuning})

    def ppl_done(self, row: dict[str, Any]) -> None:
        self.ppl[row["method"]] = row
        self.save()

    def prompt_done(self, record: dict[str, Any]) -> None:
        self.passkey[cell_id(record["method"], record["length"], record["depth"], record["trial"])] = record
        self.save()

    def ruler_done(self, record: dict[str, Any]) -> None:
        self.ruler[ruler_cell_id(record["method"], record["task"], record["length"], record["trial"])] = record
        self.save()

    def forward_done(self, task: str, length: int, usage: PeakMemory) -> None:
        self.forwards.append({"task": task, "length": length, **usage.as_dict()})


def _number(value: Any, low: float = -math.inf, high: float = math.inf) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_rows(saved: dict[str, Any]) -> None:
    """Every value the report reads has its type (a hand-edited "abc" is named here, before results.json, ppl.csv
    or a plot is rewritten from it). Raises ValueError naming the place."""
    def need(ok: bool, where: str, value: Any, allowed: str) -> None:
        if not ok:
            raise ValueError(f"{where}={value!r}: {allowed}")

    for name, row in saved["ppl"].items():
        table = row.get("ppl_by_length")
        need(isinstance(table, dict) and all(isinstance(n, str) and n.isdigit() for n in table),
             f"ppl[{name!r}].ppl_by_length", table, "an object from lengths to {ppl, lo, hi}")
        need(_number(row.get("attention_scaling")), f"ppl[{name!r}].attention_scaling", row.get("attention_scaling"),
             "a number")
        for n, stat in table.items():
            need(isinstance(stat, dict), f"ppl[{name!r}][{n}]", stat, "an object {ppl, lo, hi}")
            for key in ("ppl", "lo", "hi"):
                need(_number(stat.get(key), 0.0), f"ppl[{name!r}][{n}].{key}", stat.get(key), "a number >= 0, or null")
    for kind, rows, score in (("passkey", saved["passkey"], "correct"), ("ruler", saved["ruler"], "score")):
        for cell, record in rows.items():
            for key in ("length", "trial"):
                need(_whole(record.get(key)), f"{kind}[{cell!r}].{key}", record.get(key), "a whole number")
            if kind == "passkey":
                need(_number(record.get("depth"), 0.0, 1.0) and record.get("depth") is not None,
                     f"passkey[{cell!r}].depth", record.get("depth"), "a depth from 0 to 1")
            value = record.get(score)
            need(isinstance(value, bool) if score == "correct" else _number(value, 0.0, 1.0) and value is not None,
                 f"{kind}[{cell!r}].{score}", value, "true or false" if score == "correct" else "a score from 0 to 1")
    for i, forward in enumerate(saved["forwards"]):
        need(isinstance(forward, dict) and _whole(forward.get("length")) and _number(forward.get("seconds"), 0.0),
             f"forwards[{i}]", forward, "an object with length and seconds")
    for name, record in saved["tuning"].items():  # the option sweep (extend/tuning.py)
        need(isinstance(record, dict) and _whole(record.get("length")) and isinstance(record.get("points"), list),
             f"tuning[{name!r}]", record, "an object with length and points [...]")
        for i, point in enumerate(record["points"]):
            need(isinstance(point, dict) and isinstance(point.get("options"), dict)
                 and _number(point.get("score"), 0.0, 1.0) and point.get("score") is not None
                 and _whole(point.get("prompts")), f"tuning[{name!r}].points[{i}]", point,
                 "an object with options {...}, score from 0 to 1 and prompts")
        if "chosen" in record:  # the choice is one of the points scored
            need(record["chosen"] in [p["options"] for p in record["points"]], f"tuning[{name!r}].chosen",
                 record["chosen"], "the options of one of its points")


def _int_keys(row: dict[str, Any]) -> dict[str, Any]:
    """A saved perplexity row as it was computed: length keys are ints again, and an interval that JSON
    had to save as null (NaN: too little text to resample) is NaN again."""
    return {**row, "ppl_by_length": {int(n): {k: math.nan if v is None else v for k, v in stat.items()}
                                     for n, stat in row["ppl_by_length"].items()}}
