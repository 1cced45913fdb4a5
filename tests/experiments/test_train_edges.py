"""Edges of training and evaluation that a run meets rarely: a text holding fewer windows than asked
for, the shift test's loss change, a batch that DDP cannot split, and a fresh run's step numbering."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from posenc.experiments.config.sections import EvalConfig
from posenc.experiments.config.training_run import load_config
from posenc.experiments.evaluation.perplexity import perplexity_by_length
from posenc.experiments.evaluation.shift import loss_change
from posenc.experiments.training import language_model as train_module
from posenc.experiments.training.language_model import prepare, train
from tests.conftest import tiny_gpt

TINY = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "data.seq_len=16", "trainer.batch_size=4",
        "trainer.warmup_steps=1", "trainer.eval_interval=100", "trainer.eval_batches=1", "trainer.progress=false",
        "trainer.checkpoint_interval=100"]


def test_a_text_shorter_than_max_windows_is_scored_in_full_windows_of_the_longest_length():
    model = tiny_gpt("alibi")
    tokens = torch.randint(0, 61, (1000,), generator=torch.Generator().manual_seed(0))
    got = perplexity_by_length(model, tokens, 32, EvalConfig(length_multipliers=(1, 4), max_windows=16))
    windows = (len(tokens) - 1) // 128  # 7 windows of 4x fit; fewer than the 16 asked for
    for length in (32, 128):
        nll = 0.0
        for start in range(0, windows * 128, length):  # the same 7 x 128 tokens, cut at each length
            x = tokens[start : start + length + 1]
            with torch.no_grad():
                logits = model(x[None, :-1])[0]
            nll += F.cross_entropy(logits, x[1:], reduction="sum").item()
        assert got[length] == pytest.approx(math.exp(nll / (windows * 128)), rel=1e-5)


def test_loss_change_is_each_offsets_loss_minus_the_smallest_offsets():
    assert loss_change({0: 2.0, 10: 2.5, 100: 1.75}) == {0: 0.0, 10: 0.5, 100: -0.25}
    assert loss_change({0: 2.0, 10: "not finite"}) == {0: 0.0, 10: "not finite"}


def test_a_batch_that_ranks_cannot_split_is_a_value_error_naming_it(monkeypatch):
    monkeypatch.setattr(train_module, "world", lambda: (0, 3))
    with pytest.raises(ValueError, match=r"trainer\.batch_size=4 is not allowed: divisible by .*world size \(3\)"):
        prepare(load_config(None, TINY))


def test_a_fresh_run_counts_its_steps_from_one(tmp_path):
    result = train(load_config(None, [*TINY, "trainer.max_steps=3"]), tmp_path / "run")
    assert [h["step"] for h in result.history] == [1, 2, 3]
    assert result.history[0]["lr"] == pytest.approx(load_config(None, TINY).trainer.lr)  # warm-up 1
