"""Each method against its slow reference (tests/position_maps/reference.py) on a random tiny Llama, float64,
to 1e-5; and each differs from plain RoPE there, so agreement is not agreement with plain attention."""

from __future__ import annotations

import math

import pytest
import torch

from tests.position_maps import reference
from tests.position_maps.tiny import TRAINED, tiny_llama, token_ids

T = 45  # ~3x the trained length; not a multiple of any chunk, so partial chunks and windows are exercised

CASES = [
    ({"type": "self_extend", "group_size": 4, "window": 8}, None,
     lambda rope: lambda q, k, v: reference.self_extend(q, k, v, rope, 4, 8)),
    ({"type": "self_extend", "group_size": 3, "window": 6}, {"rope_type": "yarn", "factor": 4.0},
     lambda rope: lambda q, k, v: reference.self_extend(q, k, v, rope, 3, 6)),
    ({"type": "self_extend", "group_size": 3, "window": 7}, None,  # G does not divide W: LongLM's decode shift
     lambda rope: lambda q, k, v: reference.self_extend(q, k, v, rope, 3, 7, integer_shift=True)),
    ({"type": "dual_chunk"}, None,  # defaults: chunk_size 12, local_window 2 -> chunks of 10; scale at T/16
     lambda rope: lambda q, k, v: reference.dual_chunk(q, k, v, rope, TRAINED * 3 // 4, TRAINED // 8, TRAINED)),
    ({"type": "dual_chunk", "chunk_size": 10, "local_window": 3}, {"rope_type": "linear", "factor": 2.0},
     lambda rope: lambda q, k, v: reference.dual_chunk(q, k, v, rope, 10, 3, TRAINED)),
    ({"type": "dual_chunk", "chunk_size": 12, "local_window": 1, "scale": False}, None,  # the earlier defaults
     lambda rope: lambda q, k, v: reference.dual_chunk(q, k, v, rope, 12, 1)),
    ({"type": "dual_chunk", "chunk_size": 10, "local_window": 3, "trained_length": 32}, None,  # L given: T/32
     lambda rope: lambda q, k, v: reference.dual_chunk(q, k, v, rope, 10, 3, 32)),
    ({"type": "self_extend", "group_size": 4, "window": 8, "scale_base": 12}, None,  # LongLM's log scale
     lambda rope: lambda q, k, v: reference.self_extend(q, k, v, rope, 4, 8, scale_base=12)),
    ({"type": "lm_infinite", "n_global": 3}, None,  # window = max_distance = 16
     lambda rope: lambda q, k, v: reference.lm_infinite(q, k, v, rope, 3, TRAINED, TRAINED)),
    ({"type": "lm_infinite", "n_global": 2, "window": 10, "max_distance": 7}, None,
     lambda rope: lambda q, k, v: reference.lm_infinite(q, k, v, rope, 2, 10, 7)),
    ({"type": "attention_sinks", "n_sink": 2, "window": 9}, None,
     lambda rope: lambda q, k, v: reference.attention_sinks(q, k, v, rope, 2, 9)),
    ({"type": "attention_sinks", "n_sink": 4}, {"rope_type": "linear", "factor": 2.0},  # window 12
     lambda rope: lambda q, k, v: reference.attention_sinks(q, k, v, rope, 4, TRAINED - 4)),
    ({"type": "string"}, None,  # defaults: S = int(0.33 * 16) = 5, W = 2, the released attention factor
     lambda rope: lambda q, k, v: reference.string(q, k, v, rope, 5, 2, 0.1 * math.log(2) + 1)),
    ({"type": "string", "shifted_offset": 9, "local_value": 3, "attention_factor": 1.0},
     {"rope_type": "yarn", "factor": 4.0},  # composed with a static scaling, past the trained length
     lambda rope: lambda q, k, v: reference.string(q, k, v, rope, 9, 3, 1.0)),
]


@pytest.mark.parametrize(("spec", "scaling", "make"), CASES, ids=lambda c: str(c) if isinstance(c, dict) else "")
@torch.no_grad()
def test_matches_the_reference_written_from_the_released_code(spec, scaling, make):
    model = tiny_llama(rope_scaling=scaling, attention_extension=spec)
    rope = reference.Rope(model.cfg.d_model // model.cfg.n_head, model.cfg.rotary_base, scaling, TRAINED)
    ids = token_ids(2, T)
    expected = reference.llama_logits(model, ids, make(rope))
    got = model(ids)
    assert (got - expected).abs().max().item() < 1e-5
    plain = reference.llama_logits(model, ids, lambda q, k, v: reference.plain(q, k, v, rope))
    assert (got - plain).abs().max().item() > 1e-2  # the method changes the model here: the check has teeth


@pytest.mark.parametrize(("spec", "scaling", "make"), CASES[::2], ids=lambda c: str(c) if isinstance(c, dict) else "")
def test_gradients_match_the_reference(spec, scaling, make):
    """The chunked log-sum-exp merge differentiates like the dense softmax (training through a map works)."""
    model = tiny_llama(rope_scaling=scaling, attention_extension=spec)
    rope = reference.Rope(16, 100.0, scaling, TRAINED)
    ids = token_ids(1, 24)
    weights = torch.randn(1, 24, model.cfg.vocab_size, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad((model(ids) * weights).sum(), params)
    expected = torch.autograd.grad((reference.llama_logits(model, ids, make(rope)) * weights).sum(), params)
    for a, b in zip(got, expected, strict=True):
        assert (a - b).abs().max().item() < 1e-6 * max(1.0, b.abs().max().item())  # sinks: tables at shifted slots


@torch.no_grad()
def test_plain_reference_matches_posenc_rope():
    """The references' RoPE is the model's: plain attention through both agrees (GQA, yarn scaling)."""
    scaling = {"rope_type": "yarn", "factor": 4.0}
    model = tiny_llama(rope_scaling=scaling)
    rope = reference.Rope(16, 100.0, scaling, TRAINED)
    ids = token_ids(2, T)
    expected = reference.llama_logits(model, ids, lambda q, k, v: reference.plain(q, k, v, rope))
    assert (model(ids) - expected).abs().max().item() < 1e-5


@torch.no_grad()
def test_float32_model_close_to_the_float64_reference():
    spec = {"type": "self_extend", "group_size": 4, "window": 8}
    model = tiny_llama(attention_extension=spec, dtype=torch.float32)
    rope = reference.Rope(16, 100.0, None, TRAINED)
    ids = token_ids(1, T)
    expected = reference.llama_logits(model.double(), ids, lambda q, k, v: reference.self_extend(q, k, v, rope, 4, 8))
    got = model.float()(ids).double()
    assert (got - expected).abs().max().item() < 1e-3
