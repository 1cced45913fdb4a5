"""Bad config values are ValueErrors naming the field, the value and what is allowed, raised when
the config is built (before any model exists)."""

from __future__ import annotations

import pytest

from posenc.models import GPTConfig
from posenc.models.checks import from_dict

BASE = dict(vocab_size=64, n_layer=2, n_head=4, d_model=32, max_seq_len=64)


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"position_embedding_type": "rotary"}, r"position_embedding_type='rotary' is unknown.*alibi, .*xpos"),
        ({"position_embedding_type": "rope", "rotary_percentage": 0.0}, r"rotary_percentage=0\.0.*\(0, 1\]"),
        ({"position_embedding_type": "rope", "rotary_percentage": 1.5}, r"rotary_percentage=1\.5.*\(0, 1\]"),
        ({"position_embedding_type": "rope", "rotary_percentage": 0.3}, r"rotary_percentage=0\.3.*even whole number"),
        ({"position_embedding_type": "rope", "d_model": 36, "n_head": 4, "rotary_percentage": 1.0},
         r"rotary_percentage=1\.0.*head_dim 9"),
        ({"position_embedding_type": "rope", "seq_len_interpolation_factor": 0.5},
         r"seq_len_interpolation_factor=0\.5.*>= 1"),
        ({"n_head": 5}, r"n_head=5.*divisor of d_model=32"),
        ({"n_kv_head": 3}, r"n_kv_head=3.*divisor of n_head=4"),
        ({"vocab_size": 0}, r"vocab_size=0.*positive integer"),
        ({"dropout": 1.0}, r"dropout=1\.0.*\[0, 1\)"),
        ({"position_embedding_type": "alibi", "num_attention_heads_alibi": 8}, r"num_attention_heads_alibi=8"),
        ({"position_embedding_type": "kerple", "kerple_kernel": "exp"}, r"kerple_kernel='exp'.*log, power"),
        ({"position_embedding_type": "xpos", "xpos_scale_base": -1.0}, r"xpos_scale_base=-1\.0"),
        ({"position_embedding_type": "rope", "rope_scaling": {"rope_type": "lenear", "factor": 2.0}},
         r"rope_scaling\.rope_type='lenear'.*did you mean 'linear'"),
        ({"position_embedding_type": "rope", "rope_scaling": {"rope_type": "linear", "factor": 0.5}},
         r"rope_scaling\.factor=0\.5"),
    ],
)
def test_bad_values_name_field_value_and_allowed(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        GPTConfig(**{**BASE, **overrides})


def test_interpolation_factor_and_rope_scaling_together_is_ambiguous():
    with pytest.raises(ValueError, match="seq_len_interpolation_factor"):
        GPTConfig(**BASE, position_embedding_type="rope", seq_len_interpolation_factor=2.0,
                  rope_scaling={"rope_type": "linear", "factor": 2.0})


def test_unknown_key_suggests_the_nearest_field():
    with pytest.raises(ValueError, match=r"unknown key 'rotary_percentag'.*did you mean 'rotary_percentage'"):
        from_dict(GPTConfig, {**BASE, "rotary_percentag": 0.5})


def test_good_config_round_trips_through_a_dict():
    cfg = GPTConfig(**BASE, position_embedding_type="rope", rotary_percentage=0.5)
    assert from_dict(GPTConfig, cfg.to_dict()) == cfg
