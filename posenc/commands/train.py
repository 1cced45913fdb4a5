"""`posenc train`: one model from a YAML preset plus dotted overrides; resumes if the run folder
already holds a checkpoint. Under `torchrun --nproc_per_node N` it trains with DDP (gloo on CPU)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc.experiments.config import describe_options, load_config
from posenc.experiments.rundir import new_run_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "options (set as section.key=value):\n" + describe_options()
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.position_embedding_type=alibi")
    parser.add_argument("--config", help="YAML preset, e.g. configs/train.yaml")
    parser.add_argument("--run-dir", help="resume or write into this folder (default: a new one under out_dir)")


def main(args: argparse.Namespace) -> int:
    from posenc.experiments.ddp import distributed
    from posenc.experiments.train import train

    cfg = load_config(args.config, args.overrides)
    with distributed() as rank:
        run_dir = Path(args.run_dir) if args.run_dir else _shared_run_dir(cfg.out_dir, rank)
        result = train(cfg, run_dir)
        if rank == 0:
            last = result.history[-1]
            print(f"step {last['step']}: loss {last['loss']:.4f}" +
                  (f", val {last['val_loss']:.4f}" if "val_loss" in last else ""))
            print(f"run folder: {run_dir}")
    return 0


def _shared_run_dir(root: str, rank: int) -> Path:
    """Rank 0 makes the folder and tells the other ranks its name."""
    import torch.distributed as dist

    name = [str(new_run_dir(root, "train")) if rank == 0 else None]
    if dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(name, src=0)
    return Path(name[0])
