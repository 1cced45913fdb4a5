"""Batches of one problem size: every row has the same length, so no padding is needed."""

from __future__ import annotations

import random

import torch
from torch import Tensor

from posenc.data.tasks.base import Task, check_length
from posenc.errors import bad_value


def make_problems(task: Task, length: int, batch_size: int, rng: random.Random) -> tuple[Tensor, Tensor]:
    """-> (prompts (B,P) int64, answers (B,A) int64), rows drawn in order from `rng`."""
    check_length(length)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise bad_value("batch_size", batch_size, "a positive integer")
    pairs = [task.sample(length, rng) for _ in range(batch_size)]
    shapes = {(len(p), len(a)) for p, a in pairs}
    if len(shapes) != 1:  # a broken Task: its lengths must depend on `length` only
        raise bad_value(f"{task.name} sample lengths at length={length}", sorted(shapes), "one (prompt, answer) shape")
    prompts = torch.tensor([p for p, _ in pairs], dtype=torch.int64)  # (B,P)
    answers = torch.tensor([a for _, a in pairs], dtype=torch.int64)  # (B,A)
    return prompts, answers


def make_batch(task: Task, length: int, batch_size: int, rng: random.Random) -> tuple[Tensor, Tensor]:
    """-> (input_ids (B,T) int64, loss_mask (B,T) bool), T = prompt + answer length.

    loss_mask[b, t] is True where input_ids[b, t] is an answer token (END byte included): the
    next-token loss at position t-1 (logits[:, t-1] predicting input_ids[:, t]) counts only
    there, so the model is never asked to predict the random problem.
    """
    prompts, answers = make_problems(task, length, batch_size, rng)
    input_ids = torch.cat((prompts, answers), dim=1)  # (B,T)
    loss_mask = torch.zeros_like(input_ids, dtype=torch.bool)
    loss_mask[:, prompts.shape[1]:] = True
    return input_ids, loss_mask
