"""The contract suite can fail: schemes that break one property each are caught, in every model."""

from __future__ import annotations

import pytest
import torch

from posenc.contract import MODELS, check
from posenc.registry import SCHEMES
from posenc.scheme import Scheme


class ClaimsInvariance(Scheme):
    """Absolute positions (a position-dependent embedding) that claim shift invariance."""

    def embed(self, x, pos, input_ids=None):  # varies across dims: a LayerNorm cannot remove it
        return x + 0.5 * torch.sin(pos.float()[..., None] * torch.linspace(0.1, 1.0, x.shape[-1]))


class LocalIndexBias(Scheme):
    """ALiBi on indices within the call instead of positions: right without a cache, wrong with one."""

    def bias(self, q_pos, k_pos, q=None, k=None):
        tq, tk = q_pos.shape[1], k_pos.shape[1]
        index = torch.arange(tq)[:, None] - torch.arange(tk)[None, :]
        return -0.5 * index.abs().float()[None, None]


class Blocks(Scheme):
    """Zeroes every logit's gradient path: nothing is learned."""

    def embed(self, x, pos, input_ids=None):
        return x * 0.0


@pytest.mark.parametrize("model", ["gpt", "llama", "t5_decoder"])
@pytest.mark.parametrize("scheme,prop", [(ClaimsInvariance, "shift invariance"),
                                         (LocalIndexBias, "cache == recompute"),
                                         (Blocks, "learns")])
def test_a_broken_scheme_fails_its_property(monkeypatch, model, scheme, prop):
    monkeypatch.setitem(SCHEMES, "broken", scheme)
    [result] = check(MODELS[model], "broken", [prop])
    assert result.status == "fails", result


class NanGradient(Scheme):
    """A finite bias whose weight gets a NaN gradient (d sqrt(w - w) / dw = inf * 0)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.weight = torch.nn.Parameter(torch.ones(()))

    def bias(self, q_pos, k_pos, q=None, k=None):
        return torch.sqrt(self.weight - self.weight).expand(1, 1, q_pos.shape[1], k_pos.shape[1])


def test_a_non_finite_gradient_fails_learns_naming_the_parameter(monkeypatch):
    monkeypatch.setitem(SCHEMES, "broken", NanGradient)
    [result] = check(MODELS["gpt"], "broken", ["learns"])
    assert result.status == "fails" and "non-finite gradient in" in result.detail and "weight" in result.detail


def test_an_absolute_scheme_must_change_under_a_shift(monkeypatch):
    class DeclaresAbsolute(Scheme):
        shift_invariant = False  # but reads no positions at all

    monkeypatch.setitem(SCHEMES, "broken", DeclaresAbsolute)
    [result] = check(MODELS["gpt"], "broken", ["shift invariance"])
    assert result.status == "fails" and "must change" in result.detail


def test_properties_that_do_not_apply_are_reported_not_applicable():
    statuses = {r.name: r.status for r in check(MODELS["t5_encoder"], "alibi", ["causal", "cache == recompute"])}
    assert statuses == {"causal": "n/a", "cache == recompute": "n/a"}
    assert all(r.status == "n/a" for r in check(MODELS["t5_encoder"], "transformer_xl", ["finite"]))
