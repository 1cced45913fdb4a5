"""The one rule of every run folder, whichever command made it.

run.json says which command made the folder, with which settings, on which text. A later process
may continue the run only as the same command with the same settings, apart from the keys its
study names as changing no number the run holds (RunRule.keeps_results); anything else is
refused with one line that names every changed key. While a command works in a folder it holds
the folder's lock (run_folder.lock), so a second process is refused too. The run's wall time is kept
in run.json as it goes (Run.tick after every finished unit or step, and at the end whatever the
end), and a continuation adds to it: a kill loses at most the piece of work it cut short.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posenc.errors import bad_value
from posenc.experiments.runs import manifest
from posenc.experiments.runs.files import check_writable
from posenc.experiments.runs.lock import locked

TICK_SECONDS = 5.0  # run.json's wall time is rewritten at most this often (each write is an fsync)
_OWN = ("command", "config", "corpus", "wall_seconds")  # what open_run writes; other keys are the study's


@dataclass(frozen=True)
class RunRule:
    """What a study's run folder is called in run.json, and what a continuation may change."""

    command: str  # run.json's "command": the CLI command that made the folder
    keeps_results: tuple[str, ...]  # dotted keys, or whole sections: a continuation may change them
    hint: str = "start a new run to change them"  # said when anything else changed
    only_grow: tuple[str, ...] = ()  # lists of units (of keeps_results) a continuation may extend, never shorten


class Run:
    """An open run folder: its path, what run.json held before this process (None: a new run), and its clock."""

    def __init__(self, path: Path, rule: RunRule, stored: dict[str, Any] | None, record: dict[str, Any]) -> None:
        self.path, self.rule, self.stored, self.record = path, rule, stored, record
        self.earlier = float((stored or {}).get("wall_seconds") or 0.0)  # every earlier session of this run
        self.started = time.perf_counter()
        self._written = -float("inf")

    @property
    def resumed(self) -> bool:
        return self.stored is not None

    @property
    def wall_seconds(self) -> float:
        return self.earlier + time.perf_counter() - self.started

    def tick(self, force: bool = False) -> None:
        """Rewrite run.json with the wall time so far (at most every TICK_SECONDS unless forced)."""
        now = time.perf_counter()
        if (force or now - self._written >= TICK_SECONDS) and self.path.is_dir():
            manifest.write_record(self.path, {**self.record, "wall_seconds": self.wall_seconds})
            self._written = now

    def note(self, **extra: Any) -> None:
        """Keep more in run.json (a study's own keys), written now."""
        self.record.update(extra)
        self.tick(force=True)


@contextlib.contextmanager
def open_run(path: str | Path, rule: RunRule, config: dict[str, Any], corpus: dict[str, str] | None = None,
             read: Callable[[Path], dict[str, Any] | None] = manifest.read, **extra: Any) -> Iterator[Run]:
    """Lock the folder (made if new), check that this command may continue what it holds, write run.json
    with this session's settings (`extra`: a study's own keys) and yield the Run; its wall time is saved
    on the way out, however the block ends. `read` finds what the folder holds (default: its run.json)."""
    path = Path(path)
    check_writable(path, "run_dir")
    path.mkdir(parents=True, exist_ok=True)
    with locked(path):
        stored = read(path)
        if stored is None and not manifest.is_empty(path):
            names = ", ".join(sorted(p.name for p in path.iterdir())[:5])
            raise bad_value("run_dir", str(path), f"a new or empty folder, or a posenc {rule.command} run (this one "
                                                  f"holds files posenc did not write: {names})")
        if stored is not None:
            manifest.check_same_run(path, stored, rule.command, config, rule.keeps_results, rule.hint)
            shrunk = manifest.shrunk_lists(stored["config"], config, rule.only_grow)
            if shrunk:
                raise bad_value("run_dir", str(path), f"a continuation that keeps every unit the run holds; "
                                                      f"{'; '.join(shrunk)} (a resume never deletes results: "
                                                      f"list them again, or use a new folder for a subset)")
            if corpus is not None:
                manifest.check_corpus(stored.get("corpus"), corpus)
        kept = {k: v for k, v in (stored or {}).items() if k not in _OWN}
        run = Run(path, rule, stored, {**kept, "command": rule.command, "config": config, "corpus": corpus, **extra})
        run.tick(force=True)
        try:
            yield run
        finally:
            run.tick(force=True)
