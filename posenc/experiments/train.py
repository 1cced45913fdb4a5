"""Training: AdamW, warm-up + cosine, clipping, accumulation, bf16 autocast, periodic eval,
atomic checkpoints and exact resume, DDP through torchrun (gloo on CPU).

Exactness: the learning rate and every batch are pure functions of (seed, step), the model is
seeded, and optimizer moments are checkpointed, so a resumed run replays the same numbers.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from posenc.data.tokens import batch_generator, sample_batch, split
from posenc.errors import bad_value
from posenc.experiments import checkpoint
from posenc.experiments.config import RunConfig, TrainerConfig
from posenc.experiments.model_source import build_model
from posenc.experiments.rundir import write_json
from posenc.models import GPT


def lr_at(step: int, t: TrainerConfig) -> float:
    """Linear warm-up to lr, then cosine down to min_lr at max_steps."""
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    progress = (step - t.warmup_steps) / max(1, t.max_steps - t.warmup_steps)
    return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1 + math.cos(math.pi * min(progress, 1.0)))


@dataclass
class TrainResult:
    model: GPT
    history: list[dict[str, Any]] = field(default_factory=list)
    tokens_per_second: float = 0.0
    run_dir: Path | None = None


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _loss(model: torch.nn.Module, x: Tensor, y: Tensor, precision: str) -> Tensor:
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    with ctx:
        logits = model(x)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


@torch.no_grad()
def validation_loss(model: GPT, val: Tensor, cfg: RunConfig) -> float:
    model.eval()
    t = cfg.trainer
    losses = [_loss(model, *sample_batch(val, t.batch_size, cfg.data.seq_len, batch_generator(t.seed, -1 - i)),
                    t.precision).item() for i in range(t.eval_batches)]
    model.train()
    return sum(losses) / len(losses)


def _micro_batches(train: Tensor, cfg: RunConfig, step: int, rank: int, world_size: int):
    """The global batch of this step, cut into accumulation chunks, this rank's rows of each."""
    t = cfg.trainer
    chunk = t.batch_size // t.grad_accum
    if chunk % world_size:
        raise bad_value("trainer.batch_size", t.batch_size, f"divisible by grad_accum x world size ({world_size})")
    per_rank = chunk // world_size
    for micro in range(t.grad_accum):
        x, y = sample_batch(train, chunk, cfg.data.seq_len, batch_generator(t.seed, step, micro))
        yield x[rank * per_rank : (rank + 1) * per_rank], y[rank * per_rank : (rank + 1) * per_rank]


def build(cfg: RunConfig) -> tuple[torch.nn.Module, torch.optim.Optimizer, Tensor]:
    model, tokens = build_model(cfg)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "positions" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "positions" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.trainer.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.trainer.lr, betas=(0.9, 0.95))
    return model, opt, tokens


def train(cfg: RunConfig, run_dir: str | Path, resume: bool = True) -> TrainResult:
    run_dir = Path(run_dir)
    rank, world_size = world()
    t = cfg.trainer
    model, opt, tokens = build(cfg)
    train_tokens, val_tokens = split(tokens, cfg.data.val_fraction)
    start, history = 0, []
    last = checkpoint.latest(run_dir) if resume else None
    if last is not None:
        state = checkpoint.load(last, model, opt)
        start, history = state["step"], state["history"]
    step_model = torch.nn.parallel.DistributedDataParallel(model) if world_size > 1 else model
    writer = _tensorboard(run_dir, t.tensorboard and rank == 0)
    model.train()
    bar = tqdm(range(start, t.max_steps), desc=cfg.model.position_embedding_type, initial=start,
               total=t.max_steps, disable=not t.progress or rank != 0, leave=False)
    seen, clock = 0, time.perf_counter()
    for step in bar:
        loss = _step(step_model, opt, train_tokens, cfg, step, rank, world_size)
        seen += t.batch_size * cfg.data.seq_len
        record = {"step": step + 1, "loss": loss, "lr": lr_at(step, t)}
        if (step + 1) % t.eval_interval == 0 or step + 1 == t.max_steps:
            record["val_loss"] = validation_loss(model, val_tokens, cfg)
        history.append(record)
        tps = seen / (time.perf_counter() - clock)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tps:,.0f}")
        if writer is not None:
            for key in ("loss", "lr", "val_loss"):
                if key in record:
                    writer.add_scalar(key, record[key], step + 1)
        if rank == 0 and ((step + 1) % t.checkpoint_interval == 0 or step + 1 == t.max_steps):
            checkpoint.save(run_dir, step + 1, model, opt, {"history": history, "config": cfg.to_dict()},
                            t.keep_checkpoints)
    elapsed = time.perf_counter() - clock
    result = TrainResult(model.eval(), history, seen / elapsed if seen else 0.0, run_dir)
    if rank == 0:
        write_json(run_dir / "train.json", {"history": history, "tokens_per_second": result.tokens_per_second,
                                            "config": cfg.to_dict()})
    return result


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, train_tokens: Tensor, cfg: RunConfig,
          step: int, rank: int, world_size: int) -> float:
    t = cfg.trainer
    torch.manual_seed(t.seed * 1_000_003 + step)  # dropout masks replay on resume
    for group in opt.param_groups:
        group["lr"] = lr_at(step, t)
    total = 0.0
    micro = list(_micro_batches(train_tokens, cfg, step, rank, world_size))
    for i, (x, y) in enumerate(micro):
        sync = i == len(micro) - 1 or not hasattr(model, "no_sync")
        with contextlib.nullcontext() if sync else model.no_sync():
            loss = _loss(model, x, y, t.precision) / len(micro)
            loss.backward()
        total += loss.item()
    if t.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if world_size > 1:  # report the global mean loss, as a single process would
        reduced = torch.tensor(total)
        dist.all_reduce(reduced)
        total = reduced.item() / world_size
    return total


def _tensorboard(run_dir: Path, enabled: bool):
    if not enabled:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise bad_value("trainer.tensorboard", True, "false, or install the `tensorboard` package") from None
    return SummaryWriter(str(run_dir / "tensorboard"))
