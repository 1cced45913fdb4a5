"""Every registered scheme, automatically: the properties that make it usable in a model.

A new scheme added to the registry is tested here without touching this file.
"""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.registry import SCHEMES
from tests.conftest import VOCAB, tiny_gpt


def test_available_is_sorted_and_matches_registry():
    assert posenc.available() == sorted(SCHEMES)
    for name in ["learned_absolute", "sinusoidal", "none", "rope", "alibi", "kerple", "xpos", "sandwich"]:
        assert name in posenc.available()


def test_unknown_scheme_lists_every_valid_name():
    with pytest.raises(ValueError) as err:
        tiny_gpt("ropee")
    message = str(err.value)
    assert "position_embedding_type" in message and "'ropee'" in message and "did you mean 'rope'" in message
    for name in posenc.available():
        assert name in message


def test_logits_shape_and_finite(scheme_name, tokens):
    logits = tiny_gpt(scheme_name)(tokens)
    assert logits.shape == (*tokens.shape, VOCAB)
    assert torch.isfinite(logits).all()


def test_causal_later_tokens_never_change_earlier_logits(scheme_name, tokens):
    model = tiny_gpt(scheme_name)
    changed = tokens.clone()
    changed[:, 15:] = (changed[:, 15:] + 7) % VOCAB
    before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :15], after[:, :15], rtol=0, atol=1e-5)
    assert not torch.allclose(before[:, 15:], after[:, 15:], atol=1e-3)


@pytest.mark.parametrize("shift", [1, 37, 300])
def test_shift_invariance_matches_relative_flag(scheme_name, tokens, shift):
    """Relative schemes: logits unchanged when every position moves by k; absolute ones change."""
    model = tiny_gpt(scheme_name)
    pos = torch.arange(tokens.shape[1]).expand_as(tokens)
    base, shifted = model(tokens, position_ids=pos), model(tokens, position_ids=pos + shift)
    if SCHEMES[scheme_name].relative:
        torch.testing.assert_close(base, shifted, rtol=1e-4, atol=2e-4)
    else:
        assert (base - shifted).abs().max() > 1e-2


def test_cached_decoding_equals_full_recomputation(scheme_name, tokens):
    """Logits of prefill + one-token steps through the KV cache equal one full forward."""
    model = tiny_gpt(scheme_name)
    full = model(tokens)
    cache = model.new_cache()
    parts = [model(tokens[:, :10], cache=cache)]
    parts += [model(tokens[:, t : t + 1], cache=cache) for t in range(10, 16)]
    parts.append(model(tokens[:, 16:], cache=cache))  # a multi-token chunk after the cache
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-4, atol=1e-4)


def test_cached_generation_equals_uncached(scheme_name, tokens):
    model = tiny_gpt(scheme_name)
    prompt = tokens[:, :8]
    cached = model.generate(prompt, max_new_tokens=12, use_cache=True)
    uncached = model.generate(prompt, max_new_tokens=12, use_cache=False)
    assert cached.shape == (2, 20)
    assert torch.equal(cached, uncached)


def test_generation_from_shifted_positions_is_consistent(scheme_name, tokens):
    """Explicit start positions go through the cache too (packed or offset sequences)."""
    model = tiny_gpt(scheme_name)
    pos = torch.arange(8).expand(2, 8) + 5
    cached = model.generate(tokens[:, :8], 6, use_cache=True, position_ids=pos)
    uncached = model.generate(tokens[:, :8], 6, use_cache=False, position_ids=pos)
    assert torch.equal(cached, uncached)


def test_batch_rows_are_independent(scheme_name, tokens):
    model = tiny_gpt(scheme_name)
    torch.testing.assert_close(model(tokens)[1:], model(tokens[1:]), rtol=1e-5, atol=1e-5)


def test_overfits_a_small_batch(scheme_name):
    """A tiny GPT learns a fixed batch: the scheme does not block learning or gradients."""
    model = tiny_gpt(scheme_name, seed=3).train()
    data = torch.randint(0, VOCAB, (4, 33), generator=torch.Generator().manual_seed(5))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(80):
        logits = model(data[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), data[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], f"{scheme_name}: {losses[0]:.3f} -> {losses[-1]:.3f}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_state_dict_round_trip(scheme_name, tokens):
    model = tiny_gpt(scheme_name)
    clone = tiny_gpt(scheme_name, seed=99)
    clone.load_state_dict(model.state_dict())
    torch.testing.assert_close(model(tokens), clone(tokens))
