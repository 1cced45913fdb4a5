"""A small GPT trained on one algorithmic task (posenc.data.tasks) at problem sizes 1..L: the
training of `posenc tasks` and of compare's optional task.

The protocol of Kazemnejad et al. 2023 and Ruoss et al. 2023: the model sees problem sizes up
to L only; accuracy at sizes past L (evaluation.task_accuracy) measures how far its scheme generalises.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from posenc.data.tasks import Task, get_task, make_batch
from posenc.experiments.config.sections import OptimConfig, TaskOptim
from posenc.experiments.training.loop import fit, make_optimizer
from posenc.models import GPT, GPTConfig
from posenc.validators import positive_int


def answer_loss(model: GPT, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over answer tokens only (the problem itself is random)."""
    logits = model(input_ids[:, :-1])  # (B,T-1,V): position t predicts token t+1
    targets = input_ids[:, 1:].masked_fill(~loss_mask[:, 1:], -100)  # -100: ignored
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def train_on_task(cfg: GPTConfig, task: Task | str, max_len: int, optim: OptimConfig | None = None,
                  seed: int = 0) -> GPT:
    """The shared training loop (posenc.experiments.training.loop) on one task: each batch has one size drawn
    uniformly in 1..max_len (task.training_sizes), and the loss covers answer tokens only.

    Everything random (init, problems, Abacus offsets, randomized positions, dropout) follows `seed`
    and nothing else: the global RNG is forked, so a run gives the same model in any process.
    """
    task = get_task(task) if isinstance(task, str) else task
    optim = optim or TaskOptim()
    positive_int("max_len", max_len)
    sizes = task.training_sizes(max_len)  # 1..max_len; a SplitTask trains at its own size
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = GPT(cfg)
        rng = random.Random(seed)

        def backward(step: int) -> float:
            input_ids, loss_mask = make_batch(task, rng.randint(*sizes), optim.batch_size, rng)
            loss = answer_loss(model, input_ids, loss_mask)
            loss.backward()
            return loss.item()

        # Ctrl-C is not deferred: a unit is saved whole or not at all, so there is nothing to save mid-way.
        fit(model, make_optimizer(model, optim), optim, 0, seed, backward, catch_interrupt=False)
    return model.eval()


def longest_sequence(task: Task, length: int) -> int:
    """Prompt + answer tokens of the longest test sequence up to size `length` (Task.longest_sequence)."""
    return task.longest_sequence(length)
