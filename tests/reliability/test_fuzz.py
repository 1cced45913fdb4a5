"""Property-based fuzzing: random configs, token tensors and CLI overrides either work or raise a
ValueError that names what was wrong; never an IndexError, a C++ assert or NaN logits."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import posenc
from posenc.experiments.config.training_run import load_config
from posenc.models import GPT, GPTConfig

FIELDS = {
    "vocab_size": st.integers(-2, 80),
    "n_layer": st.integers(-1, 2),
    "n_head": st.integers(-1, 6),
    "d_model": st.sampled_from([0, 8, 12, 16, 24, 30]),
    "max_seq_len": st.integers(-1, 40),
    "position_embedding_type": st.sampled_from([*posenc.available(), "rotary", "", "ALIBI"]),
    "rotary_percentage": st.sampled_from([-0.5, 0.0, 0.25, 0.5, 0.3, 1.0, 1.5]),
    "rotary_base": st.sampled_from([0.0, 1.0, 2.0, 10000.0, -5.0]),
    "seq_len_interpolation_factor": st.sampled_from([None, 0.5, 1.0, 2.0, -1.0]),
    "num_attention_heads_alibi": st.sampled_from([None, 0, 1, 2, 7]),
    "kerple_kernel": st.sampled_from(["log", "power", "cubic"]),
    "xpos_scale_base": st.sampled_from([0.0, 512.0, 2048.0]),
    "dropout": st.sampled_from([0.0, 0.1, 1.0, -0.1]),
    "n_kv_head": st.sampled_from([None, 1, 2, 3]),
}
SAFE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _names_a_field(message: str, kwargs: dict) -> bool:
    return any(re.search(rf"\b{name}\b", message) for name in (*kwargs, "head_dim", "rope_scaling", "n_heads"))


@SAFE
@given(st.fixed_dictionaries({}, optional=FIELDS))
def test_random_configs_build_or_raise_a_named_value_error(kwargs):
    try:
        cfg = GPTConfig(**kwargs)
    except ValueError as err:
        assert _names_a_field(str(err), kwargs), str(err)
        return
    model = GPT(cfg.replace(n_layer=1, vocab_size=cfg.vocab_size)).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, min(5, cfg.max_seq_len)))
    assert torch.isfinite(model(ids)).all()


MODELS = {name: GPT(GPTConfig(vocab_size=20, n_layer=1, n_head=2, d_model=16, max_seq_len=16,
                              position_embedding_type=name)).eval() for name in posenc.available()}


@SAFE
@given(
    scheme=st.sampled_from(posenc.available()),
    batch=st.integers(0, 3),
    length=st.integers(0, 24),
    dtype=st.sampled_from([torch.int64, torch.int32, torch.float32, torch.bool, torch.uint8]),
    low=st.integers(-3, 0),
    high=st.integers(1, 25),
    shift=st.sampled_from([None, 0, 3, -2, 1000]),
)
def test_random_token_tensors_work_or_raise_value_error(scheme, batch, length, dtype, low, high, shift):
    ids = torch.randint(low, high, (batch, length)).to(dtype)
    pos = None if shift is None else torch.arange(length)[None] + shift
    try:
        logits = MODELS[scheme](ids, position_ids=pos)
    except ValueError as err:
        assert re.search(r"input_ids|position_ids|max_seq_len", str(err)), str(err)
        return
    assert logits.shape == (batch, length, 20) and torch.isfinite(logits).all()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["model", "trainer", "data", "eval", "modl", ""]),
                          st.sampled_from(["n_layer", "max_steps", "seq_len", "mode", "lr", "bogus", ""]),
                          st.sampled_from(["1", "-1", "0.5", "abc", "[1,2]", "null", "true", "", "[1,", "{a:",
                                           "${oops}", "1e999"])),
                max_size=3))
def test_random_overrides_load_or_raise_value_error(items):
    overrides = [f"{s}.{k}={v}" if s else f"{k}={v}" for s, k, v in items]
    try:
        load_config(None, overrides)
    except ValueError as err:
        assert str(err) and "\n" not in str(err)
    except Exception as err:
        pytest.fail(f"{overrides}: {type(err).__name__}: {err}")
