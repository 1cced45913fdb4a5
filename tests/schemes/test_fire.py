"""FIRE (Li et al. 2023): the bias equals the formula evaluated directly; c and L stay positive;
progressive interpolation keeps every causal pair's input in [0, 1]; i counts from the start."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.bias.fire import FIRE, FIRE_EPS, fire_inputs
from posenc.models import GPTConfig
from posenc.scheme import Dims
from tests.conftest import tiny_gpt

DIMS = Dims(32, 4, 8, 64)


def direct_fire(scheme: FIRE, i: int, j: int) -> list[float]:
    """b(i, j) for every head with Python floats: f(psi(i - j) / psi(max(L, i))), f = W2 relu(W1 x + b1) + b2."""
    c, big_l = scheme.c.item(), scheme.threshold.item()
    psi = lambda x: math.log(c * x + 1)
    x = psi(i - j) / (psi(max(big_l, i)) + FIRE_EPS)
    first, second = scheme.mlp[0], scheme.mlp[2]
    hidden = [max(0.0, w[0] * x + b) for w, b in zip(first.weight.tolist(), first.bias.tolist(), strict=True)]
    return [sum(w * a for w, a in zip(row, hidden, strict=True)) + b
            for row, b in zip(second.weight.tolist(), second.bias.tolist(), strict=True)]


@pytest.mark.parametrize("threshold", [512.0, 3.0])  # 3: queries past L are normalised by psi(i)
def test_bias_equals_direct_evaluation(threshold):
    torch.manual_seed(0)
    scheme = FIRE(DIMS, fire_init_c=0.7, fire_init_threshold=threshold)
    q_pos = torch.tensor([[4, 5, 6, 7, 8, 9], [0, 2, 3, 5, 8, 13]])  # distinct rows: no sharing
    k_pos = q_pos
    got = scheme.bias(q_pos, k_pos)  # (2,H,6,6)
    for b in range(2):
        for a, i in enumerate(q_pos[b].tolist()):
            for m, j in enumerate(k_pos[b].tolist()[: a + 1]):
                torch.testing.assert_close(got[b, :, a, m].double(), torch.tensor(direct_fire(scheme, i, j)).double(),
                                           rtol=1e-5, atol=1e-5)


def test_identical_rows_share_one_evaluation():
    scheme = FIRE(DIMS, fire_init_threshold=2.0)
    pos = torch.arange(10).expand(3, 10)
    shared = scheme.bias(pos, pos)
    assert shared.shape == (1, 4, 10, 10)
    torch.testing.assert_close(shared, scheme.bias(pos[:1], pos[:1]))


def test_inputs_lie_in_unit_interval_for_causal_pairs():
    """Progressive interpolation: psi(i - j) <= psi(max(L, i)) whenever 0 <= i - j <= i."""
    g = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 100_000, (3, 64), generator=g).sort(dim=1).values
    for c, big_l in [(0.1, 512.0), (5.0, 1.0), (1e-3, 1e4)]:
        x = fire_inputs(pos, pos, torch.tensor(c), torch.tensor(big_l))  # (3,64,64)
        causal = torch.ones(64, 64, dtype=torch.bool).tril()
        assert (x[:, causal] >= 0).all() and (x[:, causal] <= 1).all()
        assert (x[:, ~causal] == 0).all()  # future keys are clamped to distance 0 (masked later)


def test_c_and_threshold_stay_positive_under_gradient_steps():
    torch.manual_seed(0)  # the MLP's init: with the bias summed (not averaged) 7 of 40 seeds overflowed exp(log_c)
    scheme = FIRE(DIMS, fire_init_c=0.1, fire_init_threshold=4.0)
    opt = torch.optim.SGD([scheme.log_c, scheme.log_threshold], lr=50.0)
    pos = torch.arange(16)[None]
    for _ in range(20):  # steps far larger than c and L: a plain parameter would go negative at once
        loss = 10 * (scheme.c + scheme.threshold) + scheme.bias(pos, pos).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert scheme.c.item() > 0 and scheme.threshold.item() > 0
    assert torch.isfinite(scheme.bias(pos, pos)).all()


def test_bias_depends_on_query_position_not_only_distance():
    """Past L, the same distance i - j gives a different bias at a later query (unlike ALiBi)."""
    torch.manual_seed(0)
    scheme = FIRE(DIMS, fire_init_threshold=2.0)
    bias = scheme.bias(torch.arange(30)[None], torch.arange(30)[None])[0]  # (H,30,30)
    assert (bias[:, 10, 5] - bias[:, 25, 20]).abs().max() > 1e-4


def test_positions_count_from_the_sequence_start(tokens):
    """frame(): position ids 1000.. give the logits of 0.., also through the cache."""
    model = tiny_gpt("fire", fire_init_threshold=4.0)
    pos = torch.arange(tokens.shape[1]).expand_as(tokens)
    torch.testing.assert_close(model(tokens, position_ids=pos + 1000), model(tokens, position_ids=pos))
    cache = model.new_cache()
    parts = [model(tokens[:, :9], pos[:, :9] + 1000, cache)] + [
        model(tokens[:, t : t + 1], pos[:, t : t + 1] + 1000, cache) for t in range(9, 24)]
    torch.testing.assert_close(torch.cat(parts, 1), model(tokens), rtol=1e-4, atol=1e-4)


def test_one_module_serves_all_layers():
    model = tiny_gpt("fire")
    assert len(model.schemes) == 1
    assert sum(p.numel() for p in model.schemes.parameters()) == (32 + 32) + (32 * 4 + 4) + 2


@pytest.mark.parametrize("field, value", [("fire_mlp_width", 0), ("fire_init_c", 0.0), ("fire_init_threshold", -1.0)])
def test_options_are_validated(field, value):
    with pytest.raises(ValueError, match=rf"{field}="):
        GPTConfig(position_embedding_type="fire", **{field: value})
