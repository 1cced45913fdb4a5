"""Pure rotary functions: frequencies, cos/sin tables, and applying the rotation.

RoPE (Su et al. 2021, eq. 34) rotates each pair (x_a, x_b) of a head by the angle
m * theta_i, so q_m . k_n depends only on m - n. Two pairings exist:
  half-split  (GPT-NeoX, HF Llama): pair i = (x[i], x[i + R/2])
  interleaved (GPT-J, Meta Llama):  pair i = (x[2i], x[2i + 1])
R is the number of rotated dims (rotary_percentage * Dh); dims past R pass through.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.rotary import _fast


def inv_frequencies(rot_dim: int, base: float) -> Tensor:
    """theta_i = base^(-2i/R), i = 0..R/2-1, float32 (R,) -> (R/2,)."""
    exponent = torch.arange(0, rot_dim, 2, dtype=torch.int64).to(torch.float32) / rot_dim
    return 1.0 / (base**exponent)


def angles(pos: Tensor, inv_freq: Tensor) -> Tensor:
    """pos (B,T) x inv_freq (R/2,) -> (B,T,R/2) in float64, exact for positions up to 2^53."""
    return pos.to(torch.float64)[..., None] * inv_freq.to(torch.float64)


def cos_sin(pos: Tensor, inv_freq: Tensor, scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """(B,T) positions -> cos, sin as (B,1,T,R/2) float32, broadcastable over heads."""
    theta = angles(pos, inv_freq)
    return (
        (theta.cos() * scale).to(torch.float32).unsqueeze(1),
        (theta.sin() * scale).to(torch.float32).unsqueeze(1),
    )


def _pairs(x: Tensor, rot_dim: int, interleaved: bool) -> tuple[Tensor, Tensor]:
    if interleaved:
        return x[..., 0:rot_dim:2], x[..., 1:rot_dim:2]
    half = rot_dim // 2
    return x[..., :half], x[..., half:rot_dim]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """Rotate the first R = 2 * cos.shape[-1] dims of x (B,H,T,Dh); cos/sin (B,1,T,R/2).

    Writes each half once into a fresh output (no rotate_half temporaries) when no
    gradient is needed; otherwise uses out-of-place ops autograd can follow.
    """
    rot_dim = 2 * cos.shape[-1]
    if x.element_size() < 4:  # bf16/fp16: rotate in float32, round once (cos/sin keep 24 bits)
        return apply_rotary(x.float(), cos, sin, interleaved).to(x.dtype)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = _pairs(x, rot_dim, interleaved)
    if torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad):
        return _apply_differentiable(x, x1, x2, cos, sin, rot_dim, interleaved)
    fast = _fast_inference(x, cos, sin, interleaved)
    if fast is not None:
        return fast
    out = torch.empty_like(x)
    o1, o2 = _pairs(out, rot_dim, interleaved)
    torch.mul(x1, cos, out=o1)
    o1.addcmul_(x2, sin, value=-1.0)  # x1 cos - x2 sin
    torch.mul(x2, cos, out=o2)
    o2.addcmul_(x1, sin)  # x2 cos + x1 sin
    if rot_dim < x.shape[-1]:
        out[..., rot_dim:] = x[..., rot_dim:]
    return out


def _fast_inference(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor | None:
    if interleaved and _fast.can_use_complex(x):
        return _fast.rotate_interleaved_complex(x, cos, sin)
    if not interleaved and x.numel() >= _fast.COMPILE_MIN_ELEMENTS:
        return _fast.rotate_half_split_compiled(x, cos, sin)
    return None


def _apply_differentiable(x, x1, x2, cos, sin, rot_dim, interleaved):
    r1 = x1 * cos - x2 * sin
    r2 = x2 * cos + x1 * sin
    if interleaved:  # (.., R/2, 2) -> (.., R): re-interleave the pairs
        rotated = torch.stack((r1, r2), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((r1, r2), dim=-1)
    if rot_dim == x.shape[-1]:
        return rotated
    return torch.cat((rotated, x[..., rot_dim:]), dim=-1)


def apply_rotary_reference(x: Tensor, pos: Tensor, inv_freq: Tensor, interleaved: bool) -> Tensor:
    """Slow float64 complex-number rotation, the independent form used by tests."""
    rot_dim = 2 * inv_freq.shape[-1]
    xd = x.to(torch.float64)
    if interleaved:
        pairs = torch.view_as_complex(xd[..., :rot_dim].reshape(*x.shape[:-1], rot_dim // 2, 2).contiguous())
    else:
        pairs = torch.complex(xd[..., : rot_dim // 2], xd[..., rot_dim // 2 : rot_dim])
    turned = pairs * torch.polar(torch.ones_like(angles(pos, inv_freq)), angles(pos, inv_freq)).unsqueeze(1)
    if interleaved:
        rotated = torch.view_as_real(turned).flatten(-2)
    else:
        rotated = torch.cat((turned.real, turned.imag), dim=-1)
    return torch.cat((rotated, xd[..., rot_dim:]), dim=-1)
