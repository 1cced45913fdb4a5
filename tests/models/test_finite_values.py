"""Nothing non-finite enters a config (issue 24, item 4): JSON cannot spell NaN or +-inf, so a saved run
would read them back as null and a later command would refuse the run or fall back to a default. Every
number a model config takes, every scheme's options and every `rope_scaling` field, refuses them with
one line naming the field."""

from __future__ import annotations

import dataclasses
import math

import pytest

from posenc.models import GPTConfig
from posenc.models.generation import check_sampling
from posenc.registry import SCHEMES, option_fields

BASE = dict(vocab_size=64, n_layer=2, n_head=4, d_model=32, max_seq_len=64)
NOT_FINITE = (math.inf, -math.inf, math.nan)


def _float_options() -> list[tuple[str, str]]:
    """(scheme, option) for every option whose default is a float: the numbers a user types."""
    pairs = []
    for scheme, cls in SCHEMES.items():
        for name, f in option_fields(cls).items():
            default = f.default if f.default is not dataclasses.MISSING else None
            if isinstance(default, float):
                pairs.append((scheme, name))
    return pairs


def test_the_sweep_covers_the_numbers_of_the_menu():
    options = {name for _, name in _float_options()}
    assert {"rotary_base", "xpos_scale_base", "fire_init_c"} <= options  # a sweep that found nothing proves nothing


@pytest.mark.parametrize("scheme, option", _float_options())
@pytest.mark.parametrize("value", NOT_FINITE)
def test_every_float_option_of_every_scheme_refuses_non_finite_values(scheme, option, value):
    with pytest.raises(ValueError, match=rf"{option}=(inf|-inf|nan) is not allowed"):
        GPTConfig(**BASE, position_embedding_type=scheme, **{option: value})


@pytest.mark.parametrize("field", ["init_std", "dropout", "norm_eps"])
@pytest.mark.parametrize("value", NOT_FINITE)
def test_model_numbers_refuse_non_finite_values(field, value):
    with pytest.raises(ValueError, match=rf"{field}=(inf|-inf|nan) is not allowed"):
        GPTConfig(**BASE, position_embedding_type="rope", **{field: value})


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": math.inf},
    {"rope_type": "dynamic", "factor": math.nan},
    {"rope_type": "yarn", "factor": 4.0, "beta_fast": math.inf},
    {"rope_type": "yarn", "factor": 4.0, "attention_factor": math.nan},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": math.inf,
     "original_max_position_embeddings": 64},
])
def test_rope_scaling_fields_refuse_non_finite_values(scaling):
    bad = next(key for key, value in scaling.items() if isinstance(value, float) and not math.isfinite(value))
    with pytest.raises(ValueError, match=rf"rope_scaling\.{bad}=(inf|-inf|nan) is not allowed"):
        GPTConfig(**BASE, position_embedding_type="rope", rope_scaling=scaling)


def test_rope_with_interpolation_refuses_an_infinite_factor():
    with pytest.raises(ValueError, match=r"seq_len_interpolation_factor=inf is not allowed"):
        GPTConfig(**BASE, position_embedding_type="rope", seq_len_interpolation_factor=math.inf)


@pytest.mark.parametrize("value", NOT_FINITE)
def test_sampling_temperature_refuses_non_finite_values(value):
    with pytest.raises(ValueError, match=r"temperature=(inf|-inf|nan) is not allowed"):
        check_sampling(4, value, None)
