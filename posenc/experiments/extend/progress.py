"""What an extend run has finished, saved after every step (atomically) so a crashed or stopped run
resumes where it stopped: `posenc extend --resume RUN_DIR`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from posenc.atomic_files import write_json
from posenc.errors import bad_value
from posenc.experiments.extend.resource_usage import PeakMemory

STATE_FILE, CONFIG_FILE = "progress.json", "config.json"


def cell_id(scaling: str, length: int, depth: float, trial: int) -> str:
    return f"{scaling}|{length}|{depth:g}|{trial}"


class RunState:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.ppl: dict[str, dict[str, Any]] = {}  # scaling -> row
        self.passkey: dict[str, dict[str, Any]] = {}  # cell_id -> record
        self.forwards: list[dict[str, Any]] = []  # time and peak memory of every forward
        self.earlier_wall_s = 0.0  # wall time of the sessions before this one (a resumed run)
        self.session_started = time.perf_counter()

    @classmethod
    def load(cls, run_dir: Path) -> RunState:
        state = cls(run_dir)
        path = run_dir / STATE_FILE
        if path.is_file():
            saved = json.loads(path.read_text())
            state.ppl = {name: _int_keys(row) for name, row in saved["ppl"].items()}
            state.passkey, state.forwards = saved["passkey"], saved["forwards"]
            state.earlier_wall_s = saved.get("wall_s", 0.0)
        return state

    @property
    def wall_s(self) -> float:
        """Wall time of every session of this run so far."""
        return self.earlier_wall_s + time.perf_counter() - self.session_started

    def save(self) -> None:
        write_json(self.run_dir / STATE_FILE, {"ppl": self.ppl, "passkey": self.passkey, "forwards": self.forwards,
                                               "wall_s": self.wall_s})

    def ppl_done(self, row: dict[str, Any]) -> None:
        self.ppl[row["scaling"]] = row
        self.save()

    def prompt_done(self, record: dict[str, Any]) -> None:
        self.passkey[cell_id(record["scaling"], record["length"], record["depth"], record["trial"])] = record
        self.save()

    def forward_done(self, task: str, length: int, usage: PeakMemory) -> None:
        self.forwards.append({"task": task, "length": length, **usage.as_dict()})


def _int_keys(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "ppl_by_length": {int(n): v for n, v in row["ppl_by_length"].items()}}


def saved_config(run_dir: Path) -> dict[str, Any]:
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise bad_value("resume", str(run_dir), f"an extend run folder holding {CONFIG_FILE}")
    return json.loads(path.read_text())
