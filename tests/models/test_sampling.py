"""Sampled generation (temperature, top_k) in GPT, T5 and Llama, checked against each model's own
full-recomputation logits: top_k=1 and a tiny temperature are greedy, every top_k sample is among the
k largest logits, the sample frequencies follow softmax(logits / temperature), a seed repeats its
samples, and bad settings are errors naming the field."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from posenc.models import T5, Llama, LlamaConfig, T5Config
from tests.conftest import VOCAB, tiny_gpt

NEW = 8


@dataclass
class Family:
    """generate(prompt, **sampling) -> the new tokens (B, NEW); last_logits(prompt, new) -> (B,V), the
    logits the model gives for the token after prompt + new, recomputed from scratch (no cache)."""

    generate: Callable[..., torch.Tensor]
    last_logits: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def gpt_family() -> Family:
    model = tiny_gpt("rope", init_std=0.5)  # init_std 0.5: logits far apart, so ties never decide
    return Family(lambda ids, **kw: model.generate(ids, NEW, **kw)[:, ids.shape[1]:],
                  lambda ids, new: model(torch.cat((ids, new), 1))[:, -1])


def llama_family() -> Family:
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=VOCAB, n_layer=2, n_head=4, n_kv_head=2, d_model=32, ffn_hidden_size=64,
                              max_seq_len=128)).eval()
    with torch.no_grad():  # PyTorch's N(0, 1) embedding, tied to the head, would make every draw repeat its token
        model.embed_tokens.weight.mul_(0.1)
    return Family(lambda ids, **kw: model.generate(ids, NEW, **kw)[:, ids.shape[1]:],
                  lambda ids, new: model(torch.cat((ids, new), 1))[:, -1])


def t5_family() -> Family:
    torch.manual_seed(0)
    model = T5(T5Config(vocab_size=VOCAB, n_layer=2, n_head=4, d_model=32, max_seq_len=64, init_std=0.5)).eval()

    def last_logits(ids: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        start = torch.zeros(ids.shape[0], 1, dtype=torch.long)  # decoder_start_token_id 0
        return model(ids, torch.cat((start, new), 1))[:, -1]

    return Family(lambda ids, **kw: model.generate(ids, NEW, **kw)[:, 1:], last_logits)


FAMILIES = {"gpt": gpt_family, "t5": t5_family, "llama": llama_family}


@pytest.fixture(params=list(FAMILIES))
def family(request) -> Family:
    return FAMILIES[request.param]()


def prompt(batch: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, 6), generator=torch.Generator().manual_seed(seed))


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("temperature", [1.0, 5.0])
def test_top_k_1_is_greedy_at_any_temperature(family, temperature):
    ids = prompt()
    greedy = family.generate(ids)
    sampled = family.generate(ids, temperature=temperature, top_k=1, generator=seeded(1))
    assert torch.equal(sampled, greedy)


def test_a_tiny_temperature_is_greedy(family):
    ids = prompt()
    assert torch.equal(family.generate(ids, temperature=1e-6, generator=seeded(1)), family.generate(ids))


@pytest.mark.parametrize("use_cache", [True, False])
def test_every_top_k_sample_is_among_the_k_largest_recomputed_logits(family, use_cache):
    k, ids = 3, prompt(batch=6)
    new = family.generate(ids, temperature=5.0, top_k=k, use_cache=use_cache, generator=seeded(2))
    with torch.no_grad():
        for step in range(NEW):
            allowed = torch.topk(family.last_logits(ids, new[:, :step]), k).indices  # (B,k)
            assert (allowed == new[:, step : step + 1]).any(-1).all(), f"step {step}: a token outside the top {k}"
    # at a high temperature the draws spread over the k tokens: greedy decoding alone would not pass
    assert not torch.equal(new, family.generate(ids))


def test_the_same_seed_repeats_the_samples_and_another_seed_does_not(family):
    ids = prompt()
    first = family.generate(ids, temperature=2.0, generator=seeded(3))
    assert torch.equal(family.generate(ids, temperature=2.0, generator=seeded(3)), first)
    assert not torch.equal(family.generate(ids, temperature=2.0, generator=seeded(4)), first)


def test_first_token_frequencies_follow_the_tempered_softmax_of_the_top_two(family):
    """With top_k=2 the first token is the best with probability sigmoid(gap / temperature), where gap
    is the difference of the two largest logits: checked for two temperatures over 4000 draws."""
    draws, ids = 4000, prompt(batch=1)
    with torch.no_grad():
        top = torch.topk(family.last_logits(ids, ids[:, :0]), 2)
    gap, best = (top.values[0, 0] - top.values[0, 1]).item(), top.indices[0, 0].item()
    for ratio in (0.5, 2.0):  # gap / temperature
        first = family.generate(ids.expand(draws, -1), temperature=gap / ratio, top_k=2, generator=seeded(5))[:, 0]
        assert set(first.unique().tolist()) <= set(top.indices[0].tolist())
        expected = 1 / (1 + math.exp(-ratio))
        observed = (first == best).float().mean().item()
        assert abs(observed - expected) < 5 * math.sqrt(expected * (1 - expected) / draws), (ratio, observed, expected)


@pytest.mark.parametrize(("setting", "field"), [
    ({"temperature": -0.5}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 1.5}, "top_k"),
    ({"top_k": True}, "top_k"),
])
def test_bad_sampling_settings_are_value_errors_naming_the_field(family, setting, field):
    with pytest.raises(ValueError, match=f"^{field}="):
        family.generate(prompt(), **setting)
