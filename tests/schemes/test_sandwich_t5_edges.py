"""Sandwich and T5 bias edges the main tests miss: the table against the float64 formula far out (the
float32 rounding of w_k shows there), odd head dims, a distance exactly one past the table, score_mod
for Tq != Tk, buffers kept out of checkpoints, defaults equal to transformers', score dtype kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc.bias import t5_relative_position_bucket
from posenc.bias.sandwich import Sandwich, sandwich_table
from posenc.bias.t5 import T5RelativeBias
from posenc.scheme import Dims


def sandwich_formula(max_distance: int, d: int) -> np.ndarray:
    """Chi et al. 2023 eq. 3, float64: sum_{k=1..floor(d/2)} cos(r 10000^(-2k/d)) - d/2."""
    k = np.arange(1, d // 2 + 1)
    w = 10000.0 ** (-2.0 * k / d)
    r = np.arange(max_distance + 1)[:, None]
    return np.cos(r * w).sum(-1) - d / 2


@pytest.mark.parametrize("d", [64, 5])  # 5: an odd head dim sums floor(d/2) = 2 sinusoids
def test_sandwich_table_matches_the_float64_formula_far_out(d):
    table = sandwich_table(5000, d)
    assert table.shape == (5001,) and table.dtype == torch.float32
    # At r ~ 5000, w_k rounded to float32 moves r w_k by ~1e-4 rad: only a float64 table stays this close.
    np.testing.assert_allclose(table.double().numpy(), sandwich_formula(5000, d), rtol=0, atol=2e-5)


def test_sandwich_bias_at_a_distance_exactly_the_table_size():
    scheme = Sandwich(Dims(32, 4, 8, 8))
    size = scheme.table.numel()
    pos = torch.tensor([[0, size]])  # distance == numel: one past the last entry
    bias = scheme.bias(pos, pos)[0]
    expected = sandwich_formula(size, 8)[size] / (8.0 * torch.arange(1, 5) / 4)
    torch.testing.assert_close(bias[:, 1, 0], expected.float(), rtol=1e-5, atol=1e-5)


def evaluate_score_mod(mod, q_pos: torch.Tensor, k_pos: torch.Tensor, n_head: int) -> torch.Tensor:
    """score_mod evaluated on zero scores over the whole (B,H,Tq,Tk) grid with index tensors, as flex does."""
    b, h, q, k = torch.meshgrid(*(torch.arange(n) for n in (q_pos.shape[0], n_head, q_pos.shape[1],
                                                             k_pos.shape[1])), indexing="ij")
    return mod(torch.zeros(b.shape), b, h, q, k)


@pytest.mark.parametrize("scheme", [lambda: Sandwich(Dims(32, 4, 8, 64)),
                                    lambda: T5RelativeBias(Dims(32, 4, 8, 64, causal=False))])
def test_score_mod_equals_bias_when_queries_and_keys_differ_in_length(scheme):
    scheme = scheme()
    q_pos = torch.tensor([[7, 9], [30, 31]])  # Tq = 2 (decoding), Tk = 12, keys on both sides
    k_pos = torch.stack((torch.arange(12), torch.arange(25, 37)))
    got = evaluate_score_mod(scheme.score_mod(q_pos, k_pos), q_pos, k_pos, 4)
    torch.testing.assert_close(got, scheme.bias(q_pos, k_pos).expand_as(got).detach())


def test_sandwich_tables_stay_out_of_the_state_dict():
    """Parameter-free: a checkpoint holds nothing, so one saved before the table grew still loads."""
    scheme = Sandwich(Dims(32, 4, 8, 16))
    assert scheme.state_dict() == {}
    scheme.bias(torch.tensor([[0, 100]]), torch.tensor([[0, 100]]))  # grows the table
    Sandwich(Dims(32, 4, 8, 16)).load_state_dict(scheme.state_dict())


def test_sandwich_takes_no_options():
    with pytest.raises(TypeError):
        Sandwich(Dims(32, 4, 8, 16), sandwich_scale=2.0)


def test_t5_bucket_defaults_are_transformers_defaults():
    t5_attention = pytest.importorskip("transformers.models.t5.modeling_t5").T5Attention
    offsets = torch.arange(-300, 301)
    theirs = t5_attention._relative_position_bucket(offsets)  # bidirectional, 32 buckets, max distance 128
    assert torch.equal(t5_relative_position_bucket(offsets), theirs.to(torch.int64))
    causal = t5_attention._relative_position_bucket(offsets, False)  # 32 buckets all serve the past
    assert torch.equal(t5_relative_position_bucket(offsets, False), causal.to(torch.int64))


def test_t5_encoder_buckets_split_the_two_directions():
    scheme = T5RelativeBias(Dims(32, 4, 8, 64, causal=False))
    pos = torch.arange(6)[None]
    buckets = scheme.buckets(pos, pos)[0]
    expected = t5_relative_position_bucket(pos[0][None, :] - pos[0][:, None], True, 32, 128)
    assert torch.equal(buckets, expected)
    assert buckets[0, 1] == 17 and buckets[1, 0] == 1  # key after the query: the upper half


def test_t5_score_mod_keeps_the_score_dtype():
    scheme = T5RelativeBias(Dims(32, 4, 8, 64))
    pos = torch.arange(4)[None]
    mod = scheme.score_mod(pos, pos)
    zero = torch.zeros((), dtype=torch.bfloat16)
    index = torch.tensor(0)
    assert mod(zero, index, index, torch.tensor(3), index).dtype == torch.bfloat16
