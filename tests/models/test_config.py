"""Bad config values are ValueErrors naming the field, the value and what is allowed, raised when
the config is built (before any model exists)."""

from __future__ import annotations

import pytest

from posenc.models import GPTConfig
from posenc.validators import from_dict

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


@pytest.mark.parametrize("overrides, pattern", [
    ({"init_std": -1.0}, r"init_std=-1\.0"),
    ({"init_std": float("nan")}, r"init_std=nan"),
    ({"position_embedding_type": "learned_absolute", "max_seq_len": 10**12}, r"max_seq_len=1000000000000.*GiB"),
    ({"position_embedding_type": "abacus", "max_seq_len": 10**12}, r"max_seq_len=1000000000000.*GiB"),
    ({"position_embedding_type": "rope", "rope_scaling": "yarn"}, r"rope_scaling='yarn'.*dict"),
    ({"position_embedding_type": "kerple", "kerple_kernel": "power", "kerple_learn_p": False}, r"kerple_learn_p"),
    ({"position_embedding_type": "kerple", "num_attention_heads_kerple": 9}, r"num_attention_heads_kerple=9"),
])
def test_more_bad_values_name_their_field(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        GPTConfig(**{**BASE, **overrides})


def test_a_huge_max_seq_len_is_fine_for_schemes_without_a_table():
    for scheme in ("rope", "alibi", "sandwich", "relative", "none"):
        GPTConfig(**{**BASE, "max_seq_len": 10**12, "position_embedding_type": scheme})


def test_options_of_other_schemes_are_accepted_validated_and_kept_across_a_switch():
    """A NeMo config lists every option whatever the scheme; switching scheme must not lose the user's values."""
    cfg = GPTConfig(**BASE, position_embedding_type="alibi", rotary_base=500000.0, kerple_kernel="power")
    assert cfg.options.num_attention_heads_alibi is None and cfg.rotary_base == 500000.0
    rope = cfg.replace(position_embedding_type="rope")
    assert rope.options.rotary_base == 500000.0 and rope.options.rotary_percentage == 1.0
    assert rope.replace(position_embedding_type="alibi") == cfg
    with pytest.raises(ValueError, match="rotary_percentage=7"):
        GPTConfig(**BASE, position_embedding_type="alibi", rotary_percentage=7)


def test_defaults_read_back_and_equal_configs_compare_equal():
    assert GPTConfig(**BASE, position_embedding_type="rope") == GPTConfig(**BASE, position_embedding_type="rope",
                                                                          rotary_base=10000.0)
    cfg = GPTConfig(**BASE, position_embedding_type="xpos")
    assert cfg.xpos_scale_base == 2048.0 and cfg.rotary_interleaved is None and cfg.options.xpos_scale_base == 2048.0
    with pytest.raises(AttributeError, match="rotary_bass"):
        _ = cfg.rotary_bass


def test_to_dict_is_flat_and_lists_the_chosen_schemes_options():
    flat = GPTConfig(**BASE, position_embedding_type="kerple", kerple_kernel="power").to_dict()
    assert flat["kerple_kernel"] == "power" and flat["kerple_learn_p"] is True and "position_options" not in flat
    assert "rotary_base" not in flat  # options of other schemes appear only when given


def test_t5_and_llama_configs_take_the_same_flat_options():
    from posenc.models import LlamaConfig, T5Config

    t5 = T5Config(n_layer=1, d_model=32, encoder_position_embedding_type="kerple",
                  decoder_position_embedding_type="rope", kerple_kernel="power", rotary_percentage=0.5)
    assert t5.scheme_options("encoder_position_embedding_type").kerple_kernel == "power"
    assert t5.scheme_options("decoder_position_embedding_type").rotary_percentage == 0.5
    llama = LlamaConfig(vocab_size=32, n_layer=1, n_head=4, n_kv_head=2, d_model=32, ffn_hidden_size=64,
                        position_embedding_type="abacus", abacus_max_offset=7)
    assert llama.options.abacus_max_offset == 7
