"""Randomized positional encodings (Ruoss et al. 2023) as a GPT training option for any scheme."""

from __future__ import annotations

import pytest
import torch

from posenc.models import GPTConfig
from posenc.models.random_positions import random_positions
from tests.conftest import VOCAB, tiny_gpt


def test_positions_are_sorted_unique_and_in_range():
    g = torch.Generator().manual_seed(0)
    pos = random_positions(64, 20, 50, torch.device("cpu"), g)  # (64,20)
    assert pos.shape == (64, 20) and pos.dtype == torch.int64
    assert (pos[:, 1:] > pos[:, :-1]).all()  # strictly increasing: sorted and unique
    assert pos.min() >= 0 and pos.max() < 50
    assert len(set(pos.flatten().tolist())) == 50  # every position in [0, L) gets drawn
    assert len({tuple(r) for r in pos.tolist()}) > 60  # rows differ


def test_length_above_the_range_is_a_clear_error():
    with pytest.raises(ValueError, match=r"max_random_position=8.*sequence length 9"):
        random_positions(1, 9, 8, torch.device("cpu"))


def spy_positions(model) -> list[torch.Tensor]:
    """Record the positions GPT hands its scheme (every scheme's embed hook sees them)."""
    seen, scheme = [], model.schemes[0]
    original = scheme.embed
    scheme.embed = lambda x, pos, input_ids=None: (seen.append(pos), original(x, pos, input_ids))[1]
    return seen


@pytest.mark.parametrize("scheme, extra", [("rope", {}), ("alibi", {}),
                                           ("learned_absolute", {"max_random_position": 512})])
def test_random_only_in_training_and_every_scheme_trains(scheme, extra, tokens):
    model = tiny_gpt(scheme, randomized_positions=True, **extra)
    seen = spy_positions(model)
    model(tokens)  # eval: 0..T-1
    assert torch.equal(seen[-1], torch.arange(24).expand(2, 24))
    model.train()
    logits = model(tokens)
    pos = seen[-1]
    assert (pos[:, 1:] > pos[:, :-1]).all() and pos.max() < model.cfg.random_position_range
    assert not torch.equal(pos, torch.arange(24).expand(2, 24))
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten() % VOCAB)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_explicit_positions_are_kept_in_training(tokens):
    model = tiny_gpt("rope", randomized_positions=True).train()
    seen = spy_positions(model)
    model(tokens, position_ids=torch.arange(24) + 3)
    assert torch.equal(seen[-1], (torch.arange(24) + 3).expand(2, 24))


def test_off_by_default(tokens):
    model = tiny_gpt("rope").train()
    seen = spy_positions(model)
    model(tokens)
    assert torch.equal(seen[-1], torch.arange(24).expand(2, 24))
    assert model.cfg.random_position_range is None


def test_default_range_is_four_times_max_seq_len():
    assert GPTConfig(randomized_positions=True, position_embedding_type="rope", max_seq_len=64
                     ).random_position_range == 256


@pytest.mark.parametrize("overrides, pattern", [
    ({"position_embedding_type": "learned_absolute", "max_seq_len": 64, "max_random_position": 128},
     r"max_random_position=128.*<= max_seq_len=64 with learned_absolute"),
    ({"position_embedding_type": "learned_absolute", "max_seq_len": 64}, r"max_random_position=256"),
    ({"position_embedding_type": "rope", "max_seq_len": 64, "max_random_position": 32},
     r"max_random_position=32.*>= max_seq_len=64"),
    ({"position_embedding_type": "rope", "randomized_positions": "yes"}, r"randomized_positions='yes'"),
])
def test_bad_settings_are_errors_at_config_build(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        GPTConfig(**{"randomized_positions": True, **overrides})
