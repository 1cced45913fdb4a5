"""Where a training run starts: step 0 of a new folder, the newest checkpoint of the same run, or
(with --fork) another run's newest checkpoint continued in a new folder. Everything that would mix
two runs in one folder is refused here, before any step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from posenc.errors import bad_value
from posenc.experiments.config.training_run import NOT_RESULT_KEYS, RunConfig, from_plain
from posenc.experiments.runs import checkpoint, manifest
from posenc.experiments.runs.files import check_writable

FORK_HINT = "add --fork to continue it with these settings as a new run under out_dir"


def stored_run(run_dir: Path) -> dict[str, Any] | None:
    """The manifest of a `posenc train` folder; for a folder from before run.json existed, one
    rebuilt from its newest checkpoint; None for a new or empty folder. Refuses anything else."""
    found = manifest.read(run_dir)
    if found is not None:
        return found
    if not run_dir.exists():
        return None
    if not run_dir.is_dir():
        raise bad_value("run_dir", str(run_dir), "a folder (this is a file)")
    last = checkpoint.latest(run_dir)
    if last is not None:
        try:
            config = json.loads((last / "state.json").read_text(encoding="utf-8"))["config"]
        except (OSError, ValueError, KeyError) as err:
            raise checkpoint.CheckpointError(f"checkpoint {last} is unreadable or corrupt: {err}") from None
        return {"command": "train", "config": config, "corpus": None}
    if not manifest.is_empty(run_dir):
        names = ", ".join(sorted(p.name for p in run_dir.iterdir())[:5])
        raise bad_value("run_dir", str(run_dir), f"a new or empty folder, or a posenc train run (this one holds "
                                                 f"files posenc did not write: {names})")
    return None


def start_point(run_dir: Path, cfg: RunConfig, corpus: dict[str, str], fork_from: Path | None = None,
                write: bool = True) -> tuple[Path | None, dict[str, Any] | None]:
    """(checkpoint to load or None, fork record or None). Writes run.json for a new run if `write`."""
    check_writable(run_dir, "run_dir")
    config = cfg.to_dict()
    if fork_from is not None:
        return _fork(run_dir, cfg, corpus, Path(fork_from), write)
    stored = stored_run(run_dir)
    if stored is None:
        if write:
            manifest.write(run_dir, "train", config, corpus)
        return None, None
    # Through the schema: keys added since the run was made compare at their defaults.
    stored = stored | {"config": from_plain(stored["config"]).to_dict()}
    manifest.check_same_run(run_dir, stored, "train", config, NOT_RESULT_KEYS, FORK_HINT)
    manifest.check_corpus(stored.get("corpus"), corpus)
    if write and manifest.read(run_dir) is None:  # a folder from before run.json: record it now
        manifest.write(run_dir, "train", stored["config"], corpus)
    return checkpoint.latest(run_dir), stored.get("forked_from")


def _fork(run_dir: Path, cfg: RunConfig, corpus: dict[str, str], parent: Path,
          write: bool) -> tuple[Path, dict[str, Any]]:
    stored = stored_run(parent)
    last = checkpoint.latest(parent) if stored is not None else None
    if last is None:
        raise bad_value("run_dir", str(parent), "a posenc train run with a checkpoint to fork from")
    record = {"run_dir": str(parent), "step": checkpoint.step_of(last),
              "changed": manifest.differences(stored["config"], cfg.to_dict(), NOT_RESULT_KEYS)}
    if stored.get("corpus") and stored["corpus"].get("sha256") != corpus["sha256"]:
        record["changed"].append(f"corpus sha256: {stored['corpus']['sha256'][:12]}... -> {corpus['sha256'][:12]}...")
    if write:
        manifest.write(run_dir, "train", cfg.to_dict(), corpus, forked_from=record)
    return last, record
