"""The attention scales of the releases (issue 37): ChunkLlama's m(T) = 0.05 ln(T / L) + 1 on every cos and sin
past the trained length L, T the keys of the call with the cache (kv_seq_len); LongLM's optional per-query log
scale. Each against a float64 reference written from the released code (tests/position_maps/reference.py)."""

from __future__ import annotations

import pytest
import torch

from posenc.nn.mapped_attention import mapped_attention
from posenc.registry import build_position_map
from tests.position_maps import reference
from tests.position_maps.tiny import TRAINED, tiny_llama, token_ids

T = 30


@pytest.mark.parametrize("n_keys", [1, TRAINED - 1, TRAINED, TRAINED + 1, 2 * TRAINED, 37, 8 * TRAINED])
def test_dual_chunk_scales_scores_by_the_square_of_the_release_factor(n_keys):
    dca = build_position_map({"type": "dual_chunk"}, TRAINED)
    assert dca.score_scale(None, None, n_keys) == pytest.approx(reference.get_mscale(n_keys / TRAINED) ** 2, rel=1e-15)
    assert build_position_map({"type": "dual_chunk", "scale": False}, TRAINED).score_scale(None, None, n_keys) == 1.0


@torch.no_grad()
def test_a_chunk_covering_the_sequence_is_plain_rope_at_the_release_temperature():
    """One chunk: DCA's positions are plain RoPE's, so what is left is the scale, m(T) on cos and sin."""
    spec = {"type": "dual_chunk", "chunk_size": T + 3, "local_window": 2}
    model = tiny_llama(attention_extension=spec)
    rope = reference.Rope(16, 100.0, None, TRAINED)
    hot = reference.Scaled(rope, reference.get_mscale(T / TRAINED))
    ids = token_ids(2, T)
    expected = reference.llama_logits(model, ids, lambda q, k, v: reference.plain(q, k, v, hot))
    assert (model(ids) - expected).abs().max().item() < 1e-10
    unscaled = reference.llama_logits(model, ids, lambda q, k, v: reference.plain(q, k, v, rope))
    assert (model(ids) - unscaled).abs().max().item() > 1e-3  # the scale changes the model: the check has teeth


@pytest.mark.parametrize("cached", [3, TRAINED - 1, TRAINED, 40])
@torch.no_grad()
def test_a_decode_step_takes_t_as_the_keys_with_the_cache(cached):
    """ChunkLlama's decode rebuilds its tables for kv_seq_len = cached keys + 1: one query over cached + 1 keys is
    the unscaled map's with q multiplied by m(cached + 1)^2."""
    g = torch.Generator().manual_seed(5)
    n = cached + 1
    q = torch.randn(1, 4, 1, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, n, 16, generator=g, dtype=torch.float64) for _ in range(2))
    k_pos, q_pos = torch.arange(n)[None], torch.tensor([[n - 1]])
    scaled = build_position_map({"type": "dual_chunk", "chunk_size": 8, "local_window": 2}, TRAINED)
    plain = scaled.replace(scale=False, trained_length=None)
    scheme = tiny_llama().schemes[0]
    got = mapped_attention(q, k, v, scheme, scaled, q_pos, k_pos)
    expected = mapped_attention(q * reference.get_mscale(n / TRAINED) ** 2, k, v, scheme, plain, q_pos, k_pos)
    assert (got - expected).abs().max().item() < 1e-12
    if n > TRAINED:
        assert (got - mapped_attention(q, k, v, scheme, plain, q_pos, k_pos)).abs().max().item() > 1e-6


@torch.no_grad()
def test_self_extend_log_scale_decodes_as_it_prefills():
    """LongLM's scale reads each query's own position, so token-by-token decoding equals one forward."""
    model = tiny_llama(attention_extension={"type": "self_extend", "group_size": 3, "window": 5, "scale_base": 8})
    ids = token_ids(2, T)
    cache = model.new_cache()
    steps = [model(ids[:, :5], cache=cache)] + [model(ids[:, t : t + 1], cache=cache) for t in range(5, T)]
    assert (torch.cat(steps, dim=1) - model(ids)).abs().max().item() < 1e-10
    unscaled = tiny_llama(attention_extension={"type": "self_extend", "group_size": 3, "window": 5})(ids)
    within = 8  # positions 0..7 take ln(p + 1) / ln 8 <= 1: unscaled
    assert (model(ids)[:, :within] - unscaled[:, :within]).abs().max().item() < 1e-10
    assert (model(ids)[:, within:] - unscaled[:, within:]).abs().max().item() > 1e-4


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "dual_chunk", "scale": "yes"}, "attention_extension.scale='yes'"),
        ({"type": "dual_chunk", "scale": False, "trained_length": 64}, "attention_extension.trained_length=64"),
        ({"type": "dual_chunk", "trained_length": 0}, "attention_extension.trained_length=0"),
        ({"type": "self_extend", "group_size": 2, "window": 4, "scale_base": 1}, "attention_extension.scale_base=1"),
    ],
)
def test_bad_scale_options_are_one_line(spec, message):
    with pytest.raises(ValueError) as err:
        build_position_map(spec, TRAINED)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
