"""Positions stay precise whatever the model dtype: angles in float64, xPos in log space,
biases finite at long range."""

from __future__ import annotations

import torch

from posenc.bias.alibi import ALiBi
from posenc.bias.kerple import KERPLE
from posenc.bias.sandwich import Sandwich
from posenc.rotary.rope import RoPE
from posenc.rotary.xpos import XPos
from posenc.scheme import Dims
from tests.rotary_reference import numpy_rotate

DIMS = Dims(d_model=512, n_head=8, head_dim=64, max_seq_len=128)
# bf16 keeps 8 significant bits; rotating in float32 and rounding once leaves each rotated component
# within 2^-9 relative, so |q.k - exact| <= 2^-8 |q| |k| (two roundings), whatever the position.
BF16_RELATIVE_BOUND = 2.0**-8


def test_bf16_rotated_scores_at_a_million_positions_match_float64_reference():
    rope = RoPE(DIMS)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, 16, 64, generator=g).to(torch.bfloat16)
    k = torch.randn(1, 8, 16, 64, generator=g).to(torch.bfloat16)
    q_pos = torch.arange(1_000_000 - 16, 1_000_000)[None]
    k_pos = torch.arange(0, 1_000_000, 62_500)[None]  # keys spread over the whole million
    qr, _ = rope.rotate(q, q, q_pos, q_pos)
    _, kr = rope.rotate(k, k, k_pos, k_pos)
    assert qr.dtype == torch.bfloat16
    ours = qr.double() @ kr.double().transpose(-1, -2)
    exact = numpy_rotate(q, q_pos, rope.inv_freq, False) @ \
        numpy_rotate(k, k_pos, rope.inv_freq, False).transpose(-1, -2)
    norms = q.double().norm(dim=-1)[..., :, None] * k.double().norm(dim=-1)[..., None, :]
    worst = ((ours - exact).abs() / norms).max().item()
    assert worst < BF16_RELATIVE_BOUND, worst


def test_float32_angles_lose_precision_at_a_million_positions_and_ours_do_not():
    """Control for the float64 choice: HF-style float32 angles m * theta at m ~ 1e6 are off by more than
    1e-3 rad for some frequencies; posenc's tables match the float64 angles to float32 rounding."""
    rope = RoPE(DIMS)
    pos = torch.arange(999_000, 1_000_000)[None]
    exact = pos.double()[..., None] * rope.inv_freq.double()  # (1,T,R/2)
    float32_error = ((pos.float()[..., None] * rope.inv_freq).double() - exact).abs().max().item()
    cos, _ = rope.tables(pos)
    ours_error = (cos[:, 0].double() - exact.cos()).abs().max().item()
    assert float32_error > 1e-3
    assert ours_error < 1e-6


def test_xpos_scale_never_overflows_in_bf16():
    xpos = XPos(DIMS, xpos_scale_base=512.0)
    x = torch.randn(1, 8, 4, 64).to(torch.bfloat16)
    for far in (10_000, 100_000, 1_000_000, 10_000_000):
        pos = torch.arange(far, far + 4)[None]
        q, k = xpos.rotate(x, x, pos, pos)
        assert torch.isfinite(q).all() and torch.isfinite(k).all()
        assert torch.isfinite(q.float() @ k.float().transpose(-1, -2)).all()


def test_biases_at_65k_tokens_stay_finite():
    q_pos = torch.tensor([[65_535]])
    k_pos = torch.arange(65_536)[None]
    for scheme in (ALiBi(DIMS), KERPLE(DIMS, kerple_kernel="log"), KERPLE(DIMS, kerple_kernel="power"), Sandwich(DIMS)):
        bias = scheme.bias(q_pos, k_pos).detach()
        assert bias.shape == (1, 8, 1, 65_536)
        assert torch.isfinite(bias).all(), type(scheme).__name__
        assert bias[..., -1].abs().max() < 1e-4  # zero distance, zero bias


def test_a_model_cast_to_bf16_keeps_its_rotary_frequencies_exact():
    """model.to(torch.bfloat16) / .half() casts every buffer; RoPE's frequencies rounded to bf16 would turn the
    angle at position p by p * inv_freq * 2^-9 (radians: ~8 at p = 8k), so they stay float32 and the rotated
    scores of a cast model stay within bf16's rounding of the float64 reference."""
    from posenc.rotary.nd import NdRoPE

    for scheme in (RoPE(DIMS), XPos(DIMS), NdRoPE(DIMS)):
        before = {name: b.clone() for name, b in scheme.named_buffers()}
        for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.half(), lambda m: m.float()):
            cast(scheme)
            for name in scheme.exact_buffers:
                assert torch.equal(getattr(scheme, name), before[name]), (type(scheme).__name__, name)
        scheme.double()  # a cast up still follows the model
        assert all(getattr(scheme, name).dtype == torch.float64 for name in scheme.exact_buffers)
    rope = RoPE(DIMS).to(torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, 4, 64, generator=g).to(torch.bfloat16)
    pos = torch.arange(8188, 8192)[None]
    qr, _ = rope.rotate(q, q, pos, pos)
    exact = numpy_rotate(q, pos, RoPE(DIMS).inv_freq, False)
    worst = ((qr.double() - exact).abs() / q.double().norm(dim=-1, keepdim=True)).max().item()
    assert worst < BF16_RELATIVE_BOUND, worst
