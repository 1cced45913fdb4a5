"""Decoding through the KV cache equals recomputing the whole sequence, for every method (the cache keeps
raw keys and their positions; each step re-rotates them at its maps' positions)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_gpt
from tests.position_maps.test_properties import SMALL, T, _ids
from tests.position_maps.tiny import tiny_llama, token_ids


@pytest.mark.parametrize("spec", SMALL, ids=_ids)
@torch.no_grad()
def test_token_by_token_equals_full_recomputation(spec):
    model = tiny_llama(attention_extension=spec)
    ids = token_ids(2, T)
    full = model(ids)  # (B,T,V)
    cache = model.new_cache()
    steps = [model(ids[:, :5], cache=cache)]  # prefill, then one token at a time
    steps += [model(ids[:, t:t + 1], cache=cache) for t in range(5, T)]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() < 1e-10


@pytest.mark.parametrize("spec", SMALL, ids=_ids)
@torch.no_grad()
def test_prefill_in_uneven_pieces_equals_one_prefill(spec):
    model = tiny_llama(attention_extension=spec)
    ids = token_ids(1, T)
    cache = model.new_cache()
    pieces = [model(ids[:, a:b], cache=cache) for a, b in ((0, 7), (7, 19), (19, T))]
    assert (torch.cat(pieces, dim=1) - model(ids)).abs().max().item() < 1e-10


@pytest.mark.parametrize("spec", SMALL, ids=_ids)
def test_generate_with_and_without_cache_agree(spec):
    llama = tiny_llama(attention_extension=spec)
    gpt = tiny_gpt("rope", max_seq_len=16, attention_extension=spec).double()
    prompt = token_ids(2, 9)
    for model in (llama, gpt):
        cached = model.generate(prompt, max_new_tokens=20, use_cache=True)
        assert torch.equal(cached, model.generate(prompt, max_new_tokens=20, use_cache=False))
