"""`posenc report`'s side of a run folder: the study recorded in its run.json picks the report module (from the
table the command passes: shared code names no study), and that module's `rerender(run_dir, stored)` writes the
report again from the saved files, with the folder locked so no other process writes what is read."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path

from posenc.errors import bad_value
from posenc.experiments.runs import manifest
from posenc.experiments.runs.files import check_writable
from posenc.experiments.runs.lock import locked


def rerender(run_dir: Path, reports: Mapping[str, str], allowed: str) -> Path:
    """The report of run_dir written again; `reports` maps a study to its report module, `allowed` says which
    folders are (a folder of another command, or a hand-edited run.json, is refused in one line)."""
    stored = manifest.read(run_dir) if run_dir.is_dir() else None
    study = stored["command"] if stored is not None else None
    if not isinstance(study, str) or study not in reports or not (run_dir / "results.json").is_file():
        raise bad_value("run_dir", str(run_dir), allowed)
    check_writable(run_dir, "run_dir")
    with locked(run_dir):  # no other process is writing the files read here
        return importlib.import_module(reports[study]).rerender(run_dir, stored)


__all__ = ["rerender"]
