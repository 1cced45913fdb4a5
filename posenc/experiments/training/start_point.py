"""What a `posenc train` folder holds and where a training run starts: step 0 of a new folder, the
newest checkpoint of the same run (runs.rule decides whether it may continue), or (with --fork)
another run's newest checkpoint continued in a new folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from posenc.errors import bad_value
from posenc.experiments.config.training_run import RunConfig, from_plain
from posenc.experiments.runs import checkpoint, manifest
from posenc.experiments.runs.rule import RunRule
from posenc.experiments.sequence_start import recorded_start

# Keys that can differ between a run and its continuation without changing a single number it computes.
RULE = RunRule("train", keeps_results=("trainer.progress", "trainer.tensorboard", "trainer.checkpoint_interval",
                                       "trainer.keep_checkpoints", "trainer.eval_interval", "eval", "out_dir"),
               hint="add --fork to continue it with these settings as a new run under out_dir")


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


def stored_train_run(run_dir: Path) -> dict[str, Any] | None:
    """stored_run, its config read through today's schema: keys added since compare at their defaults."""
    stored = stored_run(run_dir)
    return None if stored is None else stored | {"config": from_plain(stored["config"]).to_dict()}


def fork_point(parent: Path, cfg: RunConfig, corpus: dict[str, str],
               start: list[int] | None = None) -> tuple[Path, dict[str, Any]]:
    """(the parent's newest checkpoint, the record of what the fork changes) for --fork; `start`: what this run's
    windows begin with (a change from the parent's, e.g. a BOS its run lacked, is named)."""
    stored = stored_run(parent)
    last = checkpoint.latest(parent) if stored is not None else None
    if last is None:
        raise bad_value("run_dir", str(parent), "a posenc train run with a checkpoint to fork from")
    record = {"run_dir": str(parent), "step": checkpoint.step_of(last),
              "changed": manifest.differences(stored["config"], cfg.to_dict(), RULE.keeps_results)}
    if stored.get("corpus") and stored["corpus"].get("sha256") != corpus["sha256"]:
        record["changed"].append(f"corpus sha256: {stored['corpus']['sha256'][:12]}... -> {corpus['sha256'][:12]}...")
    if start is not None and recorded_start(stored) != start:
        record["changed"].append(f"sequence_start: {recorded_start(stored)} -> {start}")
    return last, record
