"""T5 buckets against Hugging Face transformers' T5Attention._relative_position_bucket (an
independent implementation of Mesh TF's function), offset by offset."""

from __future__ import annotations

import pytest
import torch

from posenc.bias import t5_relative_position_bucket
from posenc.bias.t5 import T5RelativeBias
from posenc.scheme import Dims

T5Attention = pytest.importorskip("transformers.models.t5.modeling_t5").T5Attention

OFFSETS = torch.arange(-300, 301)  # key position minus query position


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (64, 256), (16, 64), (8, 20), (32, 32), (5, 9)])
def test_buckets_equal_transformers_for_every_offset(bidirectional, num_buckets, max_distance):
    ours = t5_relative_position_bucket(OFFSETS, bidirectional, num_buckets, max_distance)
    theirs = T5Attention._relative_position_bucket(OFFSETS, bidirectional, num_buckets, max_distance)
    assert torch.equal(ours, theirs.to(ours.dtype))
    assert int(ours.min()) >= 0 and int(ours.max()) < num_buckets


def test_scheme_bias_reads_the_table_at_transformers_buckets():
    """The model's (B,H,Tq,Tk) bias is table[bucket(n - m)], query rows by key columns, as HF's compute_bias."""
    scheme = T5RelativeBias(Dims(32, 4, 8, 64, causal=False))
    q_pos, k_pos = torch.arange(5, 25)[None], torch.arange(0, 40)[None]
    expected_buckets = T5Attention._relative_position_bucket(k_pos[:, None, :] - q_pos[:, :, None], True, 32, 128)
    expected = scheme.table[expected_buckets].permute(0, 3, 1, 2)  # (1,H,Tq,Tk)
    torch.testing.assert_close(scheme.bias(q_pos, k_pos), expected, rtol=0, atol=0)


def test_score_mod_equals_bias():
    scheme = T5RelativeBias(Dims(32, 4, 8, 64, causal=True))
    q_pos, k_pos = torch.arange(3, 9).expand(2, 6), torch.arange(0, 9).expand(2, 9)
    b, h = torch.arange(2).view(2, 1, 1, 1), torch.arange(4).view(1, 4, 1, 1)
    q_idx, kv_idx = torch.arange(6).view(1, 1, 6, 1), torch.arange(9).view(1, 1, 1, 9)
    score = torch.zeros(2, 4, 6, 9)
    with torch.no_grad():
        torch.testing.assert_close(scheme.score_mod(q_pos, k_pos)(score, b, h, q_idx, kv_idx),
                                   scheme.bias(q_pos, k_pos).expand(2, -1, -1, -1))


@pytest.mark.parametrize(("num_buckets", "max_distance"), [(2, 128), (32, 16), (True, 128)])
def test_bucket_options_that_would_divide_by_log_one_are_refused(num_buckets, max_distance):
    with pytest.raises(ValueError, match="relative_attention_"):
        t5_relative_position_bucket(OFFSETS, True, num_buckets, max_distance)
