"""Language-model training on a text corpus: the shared loop (posenc.experiments.training.loop) plus
periodic validation, atomic checkpoints, exact resume, DDP through torchrun (gloo on CPU), and a
run folder that records how the run ended: complete, diverged or interrupted.

Exactness: the learning rate and every batch are pure functions of (seed, step), torch's RNG is
reseeded per step, and optimizer moments are checkpointed, so a resumed run replays the same numbers.

From a GGUF (trainer.init_from=gguf:...), every training and validation window begins with the model's BOS
exactly when its own tokenizer adds one (posenc.experiments.sequence_start): L positions, the BOS and L - 1 text
tokens, the BOS never a target. run.json and train.json record it; a resume with another start is refused.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from posenc import stop_signals
from posenc.atomic_files import write_json
from posenc.data.tokens import batch_generator, load_corpus, sample_batch, sample_starts, target_bytes, windows_at
from posenc.errors import Interrupted, RunFailed, bad_value
from posenc.experiments.config.sections import run_device
from posenc.experiments.config.training_run import RunConfig
from posenc.experiments.evaluation.perplexity import model_device
from posenc.experiments.runs import checkpoint, manifest
from posenc.experiments.runs.files import removed_if_unused
from posenc.experiments.runs.rule import Run, open_run
from posenc.experiments.sequence_start import check_same_start, start_record
from posenc.experiments.training import preflight
from posenc.experiments.training.loop import Diverged, fit, lr_at, make_optimizer
from posenc.experiments.training.model_source import build_model, corpus_record, sequence_start_of
from posenc.experiments.training.start_point import RULE, fork_point, stored_train_run
from posenc.models import GPT

__all__ = ["TrainResult", "lr_at", "prepare", "train"]


@dataclass
class TrainResult:
    model: GPT
    history: list[dict[str, Any]] = field(default_factory=list)
    tokens_per_second: float = 0.0
    run_dir: Path | None = None
    val_tokens: Tensor | None = None  # the validation split it read: evaluation needs no second read
    train_tokens: Tensor | None = None  # the training split: the train/held-out gap is measured on its tail
    val_byte_lengths: Tensor | None = None  # UTF-8 bytes of each validation token: bits per byte
    start: list[int] = field(default_factory=list)  # what every window began with (a GGUF's BOS): evaluation too


@dataclass
class Prepared:
    """A run ready to start: everything that can fail on bad input has been checked."""

    model: torch.nn.Module
    opt: torch.optim.Optimizer
    train_tokens: Tensor
    val_tokens: Tensor
    corpus: dict[str, str]
    val_byte_lengths: Tensor
    start: list[int]  # what every window begins with: the GGUF's BOS where its tokenizer adds one, else []


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _loss(model: torch.nn.Module, x: Tensor, y: Tensor, precision: str) -> Tensor:
    ctx = torch.autocast(x.device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    with ctx:
        logits = model(x)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


@torch.no_grad()
def validation_loss(model: GPT, val: Tensor, byte_lengths: Tensor, cfg: RunConfig,
                    first: list[int] | tuple[int, ...] = ()) -> tuple[float, float]:
    """(mean loss per token, bits per byte) over eval_batches random held-out batches, each row begun with
    `first` (windows_at); bits per byte is the batches' summed nats / (ln 2 x the UTF-8 bytes their targets
    cover), so tokenizers compare."""
    model.eval()
    t, device, L = cfg.trainer, model_device(model), cfg.data.seq_len
    losses, n_bytes = [], 0
    for i in range(t.eval_batches):
        starts = sample_starts(len(val), t.batch_size, L, batch_generator(t.seed, -1 - i))
        x, y = windows_at(val, starts, L, first)
        losses.append(_loss(model, x.to(device), y.to(device), t.precision).item())
        n_bytes += target_bytes(byte_lengths, starts, L, first)
    model.train()
    loss = sum(losses) / len(losses)
    return loss, loss * len(losses) * t.batch_size * L / (math.log(2) * n_bytes)


def prepare(cfg: RunConfig) -> Prepared:
    """Load and check the text, the model's memory and the batch shape; build model and optimizer."""
    t, (_, world_size) = cfg.trainer, world()
    micro = t.batch_size // t.grad_accum
    if micro % world_size:
        raise bad_value("trainer.batch_size", t.batch_size, f"divisible by grad_accum x world size ({world_size})")
    if t.tensorboard:
        _tensorboard_writer_class()
    corpus = load_corpus(cfg.data.corpus)
    if t.init_from is None or not t.init_from.startswith("gguf:"):
        meta = preflight.check_model_fits(cfg.model, training=True)
        preflight.check_sequences_fit(meta, micro // world_size, cfg.data.seq_len, "data.seq_len", cfg.data.seq_len)
    device = run_device(t.device)
    if device.type == "cuda" and world_size > 1:  # torchrun: one GPU per process
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    model, tokens, tokenizer = build_model(cfg, corpus)
    model.to(device)
    train_tokens, val_tokens = tokens.split(cfg.data.val_fraction)
    preflight.check_text_lengths(cfg.data.seq_len, len(val_tokens), len(train_tokens))
    return Prepared(model, make_optimizer(model, t), train_tokens.ids, val_tokens.ids,
                    corpus_record(cfg, corpus, tokenizer), val_tokens.byte_lengths, sequence_start_of(cfg, model))


def _backward(model: torch.nn.Module, train_tokens: Tensor, cfg: RunConfig, rank: int, world_size: int,
              first: list[int]):
    """step -> summed loss of the step's global batch, cut into accumulation chunks, this rank's rows, each
    begun with `first`. The global batch is drawn once per step, so grad_accum changes memory use, never the data."""
    t = cfg.trainer
    chunk = t.batch_size // t.grad_accum
    per_rank = chunk // world_size
    device = model_device(model)

    def backward(step: int) -> float:
        total = 0.0
        inputs, targets = sample_batch(train_tokens, t.batch_size, cfg.data.seq_len, batch_generator(t.seed, step),
                                       first)
        for micro in range(t.grad_accum):
            rows = slice(micro * chunk + rank * per_rank, micro * chunk + (rank + 1) * per_rank)
            x, y = inputs[rows].to(device), targets[rows].to(device)  # (per_rank, L)
            sync = micro == t.grad_accum - 1 or not hasattr(model, "no_sync")
            with contextlib.nullcontext() if sync else model.no_sync():
                loss = _loss(model, x, y, t.precision) / t.grad_accum
                loss.backward()
            total += loss.item()
        return total

    return backward


def _mean_over_ranks(world_size: int):
    if world_size == 1:
        return None

    def reduce(loss: float) -> float:  # the global mean loss, as a single process would report it
        reduced = torch.tensor(loss)
        dist.all_reduce(reduced)
        return reduced.item() / world_size

    return reduce


def _same_stop_on_every_rank(world_size: int):
    """signal -> the largest over the ranks (0: none): one rank's Ctrl-C or SIGTERM stops them all after
    the same step, so rank 0's checkpoint is the state every rank holds."""
    if world_size == 1:
        return None

    def agree(signum: int) -> int:
        flag = torch.tensor(signum, dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    return agree


def train(cfg: RunConfig, run_dir: str | Path, resume: bool = True, fork_from: str | Path | None = None) -> TrainResult:
    """Train into run_dir: a new run, the same run resumed, or (fork_from) another run continued.
    Raises ValueError for bad input before any step, RunFailed if the run diverges or cannot
    write, Interrupted after saving a checkpoint on Ctrl-C. A folder this call creates is removed
    again if the run fails before writing anything but run.json."""
    run_dir = Path(run_dir)
    guard = removed_if_unused(run_dir, manifest.holds_results) if not run_dir.exists() else contextlib.nullcontext()
    with guard:
        return _train(cfg, run_dir, resume, fork_from)


def _train(cfg: RunConfig, run_dir: Path, resume: bool, fork_from: str | Path | None) -> TrainResult:
    rank, world_size = world()
    prepared = prepare(cfg)
    parent = fork_point(Path(fork_from), cfg, prepared.corpus, prepared.start) if fork_from is not None else None
    # Rank 0 holds the folder (lock, checks, run.json); the other ranks wait until it has.
    opened = open_run(run_dir, RULE, cfg.to_dict(), prepared.corpus, read=stored_train_run,
                      **({"forked_from": parent[1]} if parent else {})) if rank == 0 else contextlib.nullcontext()
    if world_size > 1 and rank != 0:
        dist.barrier()
    with opened as run:
        if run is not None:  # a resume goes on with the windows it began with, then the start is kept
            check_same_start(run, prepared.start)
            run.note(sequence_start=start_record(prepared.start))
        if world_size > 1 and rank == 0:
            dist.barrier()
        start_ckpt = parent[0] if parent else checkpoint.latest(run_dir)
        forked = parent[1] if parent else (manifest.read(run_dir) or {}).get("forked_from")
        return _run(cfg, run_dir, prepared, start_ckpt if resume else None, forked, rank, world_size, run)


def _run(cfg: RunConfig, run_dir: Path, p: Prepared, start_ckpt: Path | None, forked: dict | None,
         rank: int, world_size: int, run: Run | None) -> TrainResult:
    t, model, opt = cfg.trainer, p.model, p.opt
    start, history = 0, []
    if rank == 0:
        checkpoint.sweep_temp(run_dir)
    if start_ckpt is not None:
        state = checkpoint.load(start_ckpt, model, opt)
        start, history = state["step"], state["history"]
    step_model = torch.nn.parallel.DistributedDataParallel(model) if world_size > 1 else model
    if t.compile:  # the steps only: validation, checkpoints and the result use the model itself
        from torch import _dynamo  # compare's workers train scheme after scheme in one process: without a fresh
        _dynamo.reset()  # start each one's guards pile onto the same code objects up to the recompile limit
        step_model = torch.compile(step_model)
    writer = _tensorboard(run_dir, t.tensorboard and rank == 0)
    bar = tqdm(total=t.max_steps, initial=start, desc=cfg.model.position_embedding_type,
               disable=not t.progress or rank != 0, leave=False)
    seen, clock = [0], time.perf_counter()
    meta = lambda: {"history": history, "config": cfg.to_dict(), "corpus": p.corpus, "forked_from": forked,
                    "sequence_start": start_record(p.start)}

    def after_step(step: int, loss: float) -> None:
        record = {"step": step, "loss": loss, "lr": lr_at(step - 1, t)}
        if step % t.eval_interval == 0 or step == t.max_steps:
            record["val_loss"], record["val_bpb"] = validation_loss(model, p.val_tokens, p.val_byte_lengths, cfg,
                                                                    p.start)
            if not math.isfinite(record["val_loss"]):
                raise Diverged(step, record["val_loss"], "the validation loss")
        history.append(record)
        seen[0] += t.batch_size * cfg.data.seq_len
        bar.update()
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{seen[0] / (time.perf_counter() - clock):,.0f}")
        if writer is not None:
            for key in ("loss", "lr", "val_loss"):
                if key in record:
                    writer.add_scalar(key, record[key], step)
        saves = rank == 0 and (step % t.checkpoint_interval == 0 or step == t.max_steps)
        if run is not None:  # run.json's wall time: before every checkpoint (so it covers it), else every few s
            run.tick(force=saves)
        if saves:
            checkpoint.save(run_dir, step, model, opt, meta(), t.keep_checkpoints)

    backward = _backward(step_model, p.train_tokens, cfg, rank, world_size, p.start)
    try:
        fit(step_model, opt, t, start, t.seed, backward, after_step, _mean_over_ranks(world_size),
            agree=_same_stop_on_every_rank(world_size))
    except Diverged as err:
        _record(run_dir, rank, meta() | {"status": "diverged", "diverged_at_step": err.step, "loss": err.loss})
        raise RunFailed(f"{err}; the diverged weights were not saved ({_last(run_dir)}); train.json in {run_dir} "
                        f"records it; a smaller trainer.lr or model.init_std may help") from None
    except Interrupted as err:
        if rank == 0 and err.step is not None and err.step > start:
            checkpoint.save(run_dir, err.step, model, opt, meta(), t.keep_checkpoints)
        _record(run_dir, rank, meta() | {"status": "interrupted"})
        raise Interrupted(f"interrupted at step {err.step} ({stop_signals.name(err.signum)}): {_last(run_dir)}; "
                          f"resume with `posenc train --run-dir {run_dir}` and the same settings (its run.json)",
                          err.step, err.signum) from None
    except OSError as err:  # a full disk or a folder that turned read-only mid-run
        raise RunFailed(f"could not write {err.filename or run_dir}: {err.strerror or err}; {_last(run_dir)} "
                        f"is intact: free space, then resume with `posenc train --run-dir {run_dir}`") from None
    finally:
        bar.close()
    elapsed = time.perf_counter() - clock
    result = TrainResult(model.eval(), history, seen[0] / elapsed if seen[0] else 0.0, run_dir, p.val_tokens,
                         p.train_tokens, p.val_byte_lengths, p.start)
    if seen[0] or not (run_dir / "train.json").exists():  # a finished run resumed keeps its record (tok/s)
        _record(run_dir, rank, meta() | {"status": "complete", "tokens_per_second": result.tokens_per_second})
    return result


def _record(run_dir: Path, rank: int, data: dict[str, Any]) -> None:
    if rank == 0:
        write_json(run_dir / "train.json", data)


def _last(run_dir: Path) -> str:
    try:
        last = checkpoint.latest(run_dir)
    except checkpoint.CheckpointError:
        last = None
    return f"last checkpoint {last.name}" if last is not None else "no checkpoint yet"


def _tensorboard_writer_class():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise bad_value("trainer.tensorboard", True, "false, or install the `tensorboard` package") from None
    return SummaryWriter


def _tensorboard(run_dir: Path, enabled: bool):
    return _tensorboard_writer_class()(str(run_dir / "tensorboard")) if enabled else None
