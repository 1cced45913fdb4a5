"""learned_absolute, sinusoidal and none: absolute positions added once, or none at all."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.absolute.learned import LearnedAbsolute
from posenc.absolute.sinusoidal import Sinusoidal, sinusoidal_table
from posenc.scheme import Dims
from tests.conftest import tiny_gpt


def test_sinusoidal_table_follows_vaswani_formula():
    d = 16
    table = sinusoidal_table(torch.tensor([0, 1, 7, 500]), d)
    for row, p in enumerate([0, 1, 7, 500]):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert table[row, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[row, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_embed_adds_the_table_at_the_token_embedding_scale():
    scheme = Sinusoidal(Dims(16, 2, 8, 32, init_std=0.02))
    x = torch.zeros(1, 3, 16)
    pos = torch.tensor([[4, 5, 6]])
    added = scheme.embed(x, pos)
    torch.testing.assert_close(added, math.sqrt(2) * 0.02 * sinusoidal_table(pos, 16))
    pos = torch.arange(1000)[None]
    rms = scheme.embed(torch.zeros(1, 1000, 16), pos).pow(2).mean().sqrt().item()
    assert rms == pytest.approx(0.02, rel=0.05)  # the same size as the initial token embeddings


def test_learned_absolute_rejects_positions_past_its_table_with_a_clear_error():
    scheme = LearnedAbsolute(Dims(16, 2, 8, 32))
    with pytest.raises(ValueError, match=r"position_ids up to 32.*max_seq_len=32"):
        scheme.embed(torch.zeros(1, 33, 16), torch.arange(33)[None])
    model = tiny_gpt("learned_absolute", max_seq_len=16)
    with pytest.raises(ValueError, match="max_seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="max_seq_len=16"):
        model.generate(torch.zeros(1, 10, dtype=torch.long), max_new_tokens=10)


def test_nope_attention_output_is_order_free_without_a_mask():
    """The permutation demo: with no positions and no mask, a token's output is the same wherever it
    sits ("The dog chased another dog": both dogs get the same vector)."""
    from posenc.absolute.nope import NoPE
    from posenc.nn.attention import SelfAttention

    torch.manual_seed(0)
    attn = SelfAttention(16, 2, 2, causal=False)
    scheme = NoPE(Dims(16, 2, 8, 32, causal=False))
    x = torch.randn(1, 5, 16)
    x[0, 4] = x[0, 1]  # the same token at positions 1 and 4
    pos = torch.arange(5)[None]
    out = attn(x, scheme, pos, pos)
    torch.testing.assert_close(out[0, 1], out[0, 4])
    perm = torch.tensor([3, 0, 4, 1, 2])
    torch.testing.assert_close(attn(x[:, perm], scheme, pos, pos), out[:, perm])
