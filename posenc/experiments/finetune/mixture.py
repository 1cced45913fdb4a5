"""One training step's loss in `posenc finetune`, at the base's length L and at the target length alike:
corpus windows scored on every token (language modelling) plus passkey sequences scored on the answer
only, the two means added, every row begun with the retrieval's start (the model's BOS where its tokenizer
adds one; never a target). Every batch is a pure function of (seed, phase, step), so a resumed run
replays the same data."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.data.tokens import batch_generator, sample_batch
from posenc.experiments.evaluation.perplexity import model_device
from posenc.experiments.finetune.retrieval import IGNORE, Retrieval

PHASES = {"pretrain": 0, "finetune": 1}  # distinct batch streams for the base and the fine-tuning


@dataclass(frozen=True)
class Mixture:
    stream: Tensor  # the training split's tokens (N,)
    retrieval: Retrieval  # passkey sequences over the same split
    length: int  # tokens per row
    rows: int  # rows per step
    passkey_share: float  # share of the rows that are passkey sequences
    seed: int
    phase: str

    @property
    def passkey_rows(self) -> int:
        return round(self.rows * self.passkey_share)

    def loss(self, model: nn.Module, step: int) -> Tensor:
        device, total = model_device(model), torch.zeros(())
        n_text = self.rows - self.passkey_rows
        if n_text:
            x, y = sample_batch(self.stream, n_text, self.length, batch_generator(self.seed, step, PHASES[self.phase]),
                                self.retrieval.start)
            total = total + _cross_entropy(model(x.to(device)), y.to(device))  # (n_text, L, V)
        if self.passkey_rows:
            rng = random.Random(f"{self.phase}:{self.seed}:{step}")
            x, y = self.retrieval.training_rows(self.length, self.passkey_rows, rng)
            total = total + _cross_entropy(model(x.to(device)), y.to(device))
        return total

    def backward(self, model: nn.Module, step: int) -> float:
        """The training loop's step: this step's loss, its gradients accumulated into the model."""
        loss = self.loss(model, step)
        loss.backward()
        return loss.item()


def _cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE).cpu()
