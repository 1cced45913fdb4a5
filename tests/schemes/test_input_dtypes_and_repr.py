"""What a user hands in beyond the default float32 / int64: FIRE's inputs with half-precision or float64
parameters, T5 buckets from small integer types, Sandwich's grown table on the module's device, and
xPos's repr (print(model))."""

from __future__ import annotations

import pytest
import torch

from posenc.bias.fire import fire_inputs
from posenc.bias.sandwich import Sandwich
from posenc.bias.t5 import t5_relative_position_bucket
from posenc.rotary.xpos import XPos
from posenc.scheme import Dims

DIMS = Dims(32, 4, 8, 64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_fire_inputs_are_float32_computed_from_the_parameters_values(dtype):
    """Positions enter as float32 whatever the parameters' dtype: bf16 parameters (model.half())
    must not drag psi's normalizer into bf16 (fp16 would overflow past position 65504)."""
    q = torch.arange(990, 1010)[None]  # (1,T): positions where bf16 spacing is 4
    c, threshold = torch.tensor(0.1, dtype=dtype), torch.tensor(512.0, dtype=dtype)
    got = fire_inputs(q, q, c, threshold)
    want = fire_inputs(q, q, c.float(), threshold.float())
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.uint8])
def test_t5_buckets_do_not_depend_on_the_integer_type(dtype, bidirectional):
    values = [0, 3, 100, 127] + ([] if dtype == torch.uint8 else [-128, -3, -100, -127])
    rel = torch.tensor(values, dtype=dtype)
    got = t5_relative_position_bucket(rel, bidirectional=bidirectional, max_distance=64)
    want = t5_relative_position_bucket(torch.tensor(values), bidirectional=bidirectional, max_distance=64)
    assert got.dtype == torch.int64
    assert torch.equal(got, want)


def test_xpos_prints_its_scale_base():
    assert "scale_base=2048" in repr(XPos(DIMS, xpos_scale_base=2048.0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)")
def test_sandwich_grows_its_table_on_the_modules_device():
    cpu = Sandwich(DIMS)
    gpu = Sandwich(DIMS).cuda()
    far = torch.arange(-5000, 1)  # past any table built at init
    got = gpu.bias_by_distance(far.cuda())
    assert got.device.type == "cuda" and gpu.table.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), cpu.bias_by_distance(far))
