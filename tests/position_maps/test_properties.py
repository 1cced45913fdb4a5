"""Properties every position map keeps: plain RoPE when its window covers the sequence, Self-Extend with G = 1 is
plain RoPE, causality, exactly the keys the paper attends, chunking and batching change nothing, gradients."""

from __future__ import annotations

import pytest
import torch

from posenc.nn.mapped_attention import mapped_attention
from posenc.position_maps.scheme import PositionMapped
from tests.conftest import tiny_gpt
from tests.position_maps.tiny import tiny_llama, token_ids

T = 30
SMALL = [  # windows well inside T: every map of every method is used
    {"type": "self_extend", "group_size": 3, "window": 5},
    {"type": "dual_chunk", "chunk_size": 8, "local_window": 2, "scale": False},  # the scale: test_attention_scale.py
    {"type": "lm_infinite", "n_global": 2, "window": 6},
    {"type": "attention_sinks", "n_sink": 3, "window": 5},
]
COVERING = [  # windows (chunks) that hold the whole sequence
    {"type": "self_extend", "group_size": 4, "window": T},
    {"type": "dual_chunk", "chunk_size": T + 3, "local_window": 2, "scale": False},
    {"type": "lm_infinite", "n_global": 0, "window": T},
    {"type": "attention_sinks", "n_sink": 0, "window": T},
]


def _ids(spec: dict) -> str:
    return "-".join(str(v) for v in spec.values())


@pytest.mark.parametrize("spec", COVERING, ids=_ids)
@torch.no_grad()
def test_a_window_covering_the_sequence_is_plain_rope(spec):
    ids = token_ids(2, T)
    plain = tiny_llama()(ids)
    assert (tiny_llama(attention_extension=spec)(ids) - plain).abs().max().item() < 1e-10
    gpt_plain = tiny_gpt("rope", max_seq_len=16).double()(ids)  # GPT with rope: the same option
    gpt = tiny_gpt("rope", max_seq_len=16, attention_extension=spec).double()(ids)
    assert (gpt - gpt_plain).abs().max().item() < 1e-10


@pytest.mark.parametrize("scheme", ["xpos", "p_rope"])
@torch.no_grad()
def test_other_rotary_schemes_take_the_maps_too(scheme):
    ids = token_ids(2, T)
    plain = tiny_gpt(scheme, max_seq_len=16).double()
    covering = tiny_gpt(scheme, max_seq_len=16, attention_extension=COVERING[0]).double()
    assert (covering(ids) - plain(ids)).abs().max().item() < 1e-10
    extended = tiny_gpt(scheme, max_seq_len=16, attention_extension=SMALL[0]).double()
    assert (extended(ids) - plain(ids)).abs().max().item() > 1e-4
    cache = extended.new_cache()
    steps = torch.cat([extended(ids[:, :4], cache=cache)] + [extended(ids[:, t:t + 1], cache=cache)
                                                             for t in range(4, T)], dim=1)
    assert (steps - extended(ids)).abs().max().item() < 1e-10


@pytest.mark.parametrize("window", [1, 4, 100])
@torch.no_grad()
def test_self_extend_with_group_size_one_is_plain_rope(window):
    ids = token_ids(2, T)
    spec = {"type": "self_extend", "group_size": 1, "window": window}
    assert (tiny_llama(attention_extension=spec)(ids) - tiny_llama()(ids)).abs().max().item() < 1e-10


@pytest.mark.parametrize("spec", SMALL, ids=_ids)
@torch.no_grad()
def test_causal_the_past_does_not_read_the_future(spec):
    model = tiny_llama(attention_extension=spec)
    ids = token_ids(1, T)
    changed = ids.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % model.cfg.vocab_size
    a, b = model(ids), model(changed)
    assert (a[:, :20] - b[:, :20]).abs().max().item() < 1e-12
    assert (a[:, 20:] - b[:, 20:]).abs().max().item() > 1e-3


def _attended(scheme: PositionMapped, t: int) -> torch.Tensor:
    """(T,T) bool: which keys each query reads, found by changing one value at a time."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, t, 16, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    pos = torch.arange(t)[None]
    base = scheme.attend(q, k, v, pos, pos, causal=True)
    seen = torch.zeros(t, t, dtype=torch.bool)
    for j in range(t):
        moved = v.clone()
        moved[:, :, j] += 1.0
        seen[:, j] = (scheme.attend(q, k, moved, pos, pos, causal=True) - base).abs().amax(dim=(0, 1, 3)) > 1e-9
    return seen


@pytest.mark.parametrize("spec", SMALL, ids=_ids)
def test_attends_exactly_the_keys_of_the_paper(spec):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = {  # what each paper's mask keeps, causal
        "self_extend": j <= i,
        "dual_chunk": j <= i,
        "lm_infinite": (j <= i) & ((i - j < spec.get("window", 0)) | (j < spec.get("n_global", 0))),
        "attention_sinks": (j <= i) & ((i - j < spec.get("window", 0)) | (j < spec.get("n_sink", 0))),
    }[spec["type"]]
    scheme = tiny_llama(attention_extension=spec).schemes[0]
    assert torch.equal(_attended(scheme, T), allowed)


@pytest.mark.parametrize("spec", SMALL, ids=_ids)
def test_chunk_size_changes_nothing(spec):
    scheme = tiny_llama(attention_extension=spec).schemes[0]
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, h, T, 16, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    pos = torch.arange(T).expand(2, T)
    whole = mapped_attention(q, k, v, scheme.inner, scheme.position_map, pos, pos)
    for budget in (1, 4 * 2 * 7 * T):  # one query row per chunk; 7 rows per chunk
        rows = mapped_attention(q, k, v, scheme.inner, scheme.position_map, pos, pos, budget=budget)
        assert (rows - whole).abs().max().item() < 1e-12


@pytest.mark.parametrize("spec", SMALL, ids=_ids)
@torch.no_grad()
def test_rows_with_different_positions_batch_like_alone(spec):
    model = tiny_llama(attention_extension=spec)
    ids = token_ids(2, T)
    position_ids = torch.stack((torch.arange(T), torch.arange(T) + 7))  # chunk borders differ per row
    batched = model(ids, position_ids=position_ids)
    for r in range(2):
        alone = model(ids[r:r + 1], position_ids=position_ids[r:r + 1])
        assert (batched[r:r + 1] - alone).abs().max().item() < 1e-12


def test_dropout_acts_on_the_weights_and_the_functional_form_agrees():
    import posenc

    scheme = tiny_llama(attention_extension=SMALL[0]).schemes[0]
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, h, 12, 16, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    pos = torch.arange(12)[None]
    plain = scheme.attend(q, k, v, pos, pos, causal=True)
    assert torch.equal(scheme.attend(q, k, v, pos, pos, causal=True, dropout=1.0), torch.zeros_like(plain))
    assert torch.equal(posenc.attention(q, k, v, scheme, pos, pos), plain)  # posenc.attention takes the hook


@pytest.mark.parametrize("spec", SMALL, ids=_ids)
@torch.no_grad()
def test_half_precision_runs_in_float32_inside(spec):
    model = tiny_llama(attention_extension=spec, dtype=torch.float32)
    ids = token_ids(1, T)
    full = model(ids)
    half = model.to(torch.bfloat16)(ids).float()
    assert (half - full).abs().max().item() < 0.1 * full.abs().max().item()


@pytest.mark.parametrize("spec", SMALL, ids=_ids)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@torch.no_grad()
def test_fused_kernel_equals_the_eager_form(spec, dtype):
    """The CPU flash kernel per map (inference) against the eager scores (training, other devices)."""
    scheme = tiny_llama(attention_extension=spec).schemes[0]
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, h, T, 16, generator=g, dtype=torch.float64).to(dtype) for h in (4, 2, 2))
    pos = torch.stack((torch.arange(T), torch.arange(T) + 5))
    for budget in (None, 4 * 2 * 7 * T):
        fused = mapped_attention(q, k, v, scheme.inner, scheme.position_map, pos, pos, budget=budget, fused=True)
        eager = mapped_attention(q, k, v, scheme.inner, scheme.position_map, pos, pos, budget=budget, fused=False)
        assert (fused - eager).abs().max().item() < (1e-12 if dtype == torch.float64 else 1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)")
@pytest.mark.parametrize("spec", SMALL, ids=_ids)
@torch.no_grad()
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("budget", [None, 4 * 2 * 7 * T])
def test_cuda_fused_and_eager_agree_with_the_cpu(spec, fused, budget):
    """CUDA's memory-efficient kernel per map (inference) and the eager form, against the CPU's reference, with
    rows that start mid-sequence and whole chunks of rows that score no key of a map (a small budget)."""
    scheme = tiny_llama(attention_extension=spec, dtype=torch.float32).schemes[0]
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, h, T, 16, generator=g) for h in (4, 2, 2))
    pos = torch.stack((torch.arange(T), torch.arange(T) + 5))
    cpu = mapped_attention(q, k, v, scheme.inner, scheme.position_map, pos, pos, fused=False)
    scheme = scheme.cuda()
    cuda = mapped_attention(q.cuda(), k.cuda(), v.cuda(), scheme.inner, scheme.position_map, pos.cuda(), pos.cuda(),
                            budget=budget, fused=fused)
    assert (cuda.cpu() - cpu).abs().max().item() < 1e-4


@pytest.mark.parametrize("spec", SMALL, ids=_ids)
@torch.no_grad()
def test_plain_within_is_exactly_the_length_up_to_which_the_map_is_plain_rope(spec):
    """plain_within is a promise a sweep relies on to share forwards: it must hold up to its length, and
    not be vacuous (these maps change the scores within T)."""
    from posenc.registry import build_position_map
    from tests.position_maps.tiny import TRAINED

    within = build_position_map(spec, TRAINED).plain_within
    assert 1 <= within < T
    ids = token_ids(2, T)
    plain, mapped = tiny_llama()(ids), tiny_llama(attention_extension=spec)(ids)
    assert (mapped[:, :within] - plain[:, :within]).abs().max().item() < 1e-10
    assert (mapped[:, within:] - plain[:, within:]).abs().max().item() > 1e-4
