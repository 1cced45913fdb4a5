"""Content-relative schemes beyond their defaults: Shaw honours options passed as an object and names
its field in errors; Transformer-XL's kept projections follow in-place weight changes and start at
Dai et al.'s scale."""

from __future__ import annotations

import pytest
import torch

from posenc.content.shaw import Shaw, ShawOptions
from posenc.content.transformer_xl import TransformerXL
from posenc.scheme import Dims

DIMS = Dims(32, 4, 8, 64)


def test_shaw_uses_the_options_object_it_is_given():
    shaw = Shaw(DIMS, ShawOptions(shaw_max_relative_position=5))
    assert shaw.max_relative_position == 5 and Shaw(DIMS).max_relative_position == 16


@pytest.mark.parametrize("bad", [0, -3, 2.5, "8"])
def test_shaw_names_its_field_and_value_in_errors(bad):
    with pytest.raises(ValueError, match=rf"^shaw_max_relative_position={bad!r} is not allowed: a positive integer"):
        ShawOptions(shaw_max_relative_position=bad)


def test_transformer_xl_kept_projections_follow_in_place_weight_changes():
    txl = TransformerXL(DIMS).eval()
    like = torch.zeros(1)
    with torch.no_grad():
        before = txl.projected_by_offset(0, 20, like).clone()  # offsets r = 0..20 are distances 0..-20, reversed
        torch.testing.assert_close(before, txl.projected_distances(-20, 0, like).flip(1))
        txl.w_r.weight.mul_(2.0)  # an optimizer step or a load_state_dict changes the weight in place
        after = txl.projected_by_offset(0, 20, like)
        torch.testing.assert_close(after, txl.projected_distances(-20, 0, like).flip(1))
        torch.testing.assert_close(after, 2 * before)


def test_transformer_xl_biases_start_at_dai_et_al_scale():
    torch.manual_seed(0)
    txl = TransformerXL(Dims(256, 8, 32, 64))
    for p in (txl.u, txl.v, txl.w_r.weight):
        assert 0.015 < float(p.std()) < 0.025  # N(0, 0.02), as Transformer-XL initialises them
