"""`posenc train`'s run folder from start to end: a new folder under out_dir (made by rank 0, its name sent to
the other ranks under DDP; removed again when the run fails before it holds results), the asked folder resumed,
or (fork) another run continued in a new folder; then the last step's numbers and where the run is."""

from __future__ import annotations

import math
from pathlib import Path

from posenc.experiments.config.sections import run_device
from posenc.experiments.config.training_run import RunConfig
from posenc.experiments.runs.files import check_writable, new_run_dir, removed_if_unused
from posenc.experiments.runs.manifest import holds_results
from posenc.experiments.training.ddp import distributed
from posenc.experiments.training.language_model import train


def run(cfg: RunConfig, run_dir: Path | None, fork: bool = False) -> int:
    """Train `cfg` into run_dir (resumed or started there), a new folder under out_dir, or, with `fork`, a new
    folder continuing the run in run_dir from its newest checkpoint."""
    if fork and run_dir is None:
        raise ValueError("--fork needs --run-dir: the run to continue")
    if run_dir is None or fork:
        check_writable(cfg.out_dir, "out_dir")
    with distributed(run_device(cfg.trainer.device)) as rank:
        fork_from = run_dir if fork else None
        if run_dir is not None and not fork:
            result = train(cfg, run_dir)
        else:
            run_dir = _shared_run_dir(cfg.out_dir, rank)
            with removed_if_unused(run_dir, holds_results):  # bad input found in train(): no empty folder
                result = train(cfg, run_dir, fork_from=fork_from)
        if rank == 0:
            last = result.history[-1]
            print(f"step {last['step']}: loss {last['loss']:.4f}" + (
                f", val {last['val_loss']:.4f} (perplexity {math.exp(last['val_loss']):.3f} per token, "
                f"{last['val_bpb']:.4f} bits per byte)" if "val_bpb" in last else ""))
            print(f"run folder: {run_dir}")
    return 0


def _shared_run_dir(root: str, rank: int) -> Path:
    """Rank 0 makes the folder and tells the other ranks its name."""
    import torch.distributed as dist

    name = [str(new_run_dir(root, "train")) if rank == 0 else None]
    if dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(name, src=0)
    return Path(name[0])


__all__ = ["run"]
