"""`posenc train`: one model from a YAML preset plus dotted overrides. `--run-dir` resumes a run
with the same settings; `--fork` continues one with other settings in a new folder. Under
`torchrun --nproc_per_node N` it trains with DDP (gloo on CPU)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from posenc.experiments.config.sections import run_device
from posenc.experiments.config.training_run import describe_options, load_config
from posenc.experiments.runs.files import check_writable, new_run_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "options (set as section.key=value):\n" + describe_options()
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.position_embedding_type=alibi")
    parser.add_argument("--config", help="YAML preset, e.g. configs/train.yaml")
    parser.add_argument("--run-dir", help="resume this run (same settings), or start a new one in this folder "
                                          "(default: a new folder under out_dir)")
    parser.add_argument("--fork", action="store_true",
                        help="continue the --run-dir run from its newest checkpoint with these settings, in a new "
                             "folder under out_dir; the original run is left as it is")


def main(args: argparse.Namespace) -> int:
    from posenc.experiments.runs.files import removed_if_unused
    from posenc.experiments.runs.manifest import holds_results
    from posenc.experiments.training.ddp import distributed
    from posenc.experiments.training.language_model import train

    cfg = load_config(args.config, args.overrides)
    if args.fork and not args.run_dir:
        raise ValueError("--fork needs --run-dir: the run to continue")
    if not args.run_dir or args.fork:
        check_writable(cfg.out_dir, "out_dir")
    with distributed(run_device(cfg.trainer.device)) as rank:
        fork_from = Path(args.run_dir) if args.fork else None
        if args.run_dir and not args.fork:
            result = train(cfg, run_dir := Path(args.run_dir))
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
