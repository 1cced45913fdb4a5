"""Options reach the scheme that reads them, whichever way they are passed; KERPLE's inward clamp
lets a gradient through exactly when a descent step moves the value back into its domain; a head
dimension RoPE cannot rotate is a ValueError naming it."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.bias.kerple import KERPLE, KERPLEOptions, _clamp_inward
from posenc.registry import build
from posenc.rotary.scaling import frequencies
from posenc.scheme import Dims

DIMS = Dims(32, 4, 8, 64)


@pytest.mark.parametrize("name", posenc.available())
def test_every_scheme_built_through_the_registry_keeps_its_dims(name):
    assert build(name, DIMS).dims == DIMS


def test_kerple_uses_the_options_object_it_is_given():
    power = KERPLE(DIMS, KERPLEOptions(kerple_kernel="power", num_attention_heads_kerple=2))
    assert power.kernel == "power" and "kernel=power" in repr(power)
    two_parameter = KERPLE(DIMS, KERPLEOptions(kerple_learn_p=False))
    assert (two_parameter.kernel, two_parameter.learn_p) == ("log", False)


def test_the_inward_clamp_passes_gradients_that_move_the_value_back_inside():
    x = torch.tensor([3.0, 3.0, -1.0, -1.0, 1.0], requires_grad=True)
    _clamp_inward(x, 0.01, 2.0).backward(torch.tensor([0.5, -0.5, 0.5, -0.5, 0.7]))
    # above 2: a descent step (x - lr*g) lowers x only for g > 0; below 0.01 it raises x only for g < 0
    assert x.grad.tolist() == [0.5, 0.0, 0.0, -0.5, pytest.approx(0.7)]


@pytest.mark.parametrize("head_dim", [0, 7, -2])
def test_a_head_dim_rope_cannot_rotate_is_a_value_error_naming_it(head_dim):
    with pytest.raises(ValueError, match="head_dim"):
        frequencies(head_dim, 10000.0)
