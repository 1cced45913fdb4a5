"""Pure rotary functions: frequencies, cos/sin tables, and applying the rotation.

RoPE (Su et al. 2021, eq. 34) rotates each pair (x_a, x_b) of a head by the angle
m * theta_i, so q_m . k_n depends only on m - n. Two pairings exist:
  half-split  (GPT-NeoX, HF Llama): pair i = (x[i], x[i + R/2])
  interleaved (GPT-J, Meta Llama):  pair i = (x[2i], x[2i + 1])
R is the number of rotated dims (rotary_percentage * Dh); dims past R pass through.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from posenc.nn import dispatch
from posenc.nn import triton as gpu
from posenc.nn.kernel_checks import check_rotary
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
    """Rotate the first R = 2 * cos.shape[-1] dims of x (B,H,T,Dh); cos/sin (B|1,1,T,R/2).

    The kernels are posenc.nn.dispatch's rotation table for (device, dtype, grad). With a gradient to x, a custom
    autograd function: the backward of a rotation is the rotation by the opposite angle, so it saves only cos/sin
    and runs the same kernels twice. Left to autograd, the slices and cat of the plain formula cost ~5x more
    (zero-filled slice gradients); that formula serves tables that carry parameters.
    """
    check_rotary(x, cos, sin)  # one error on every path (the native kernel would write past each row)
    grad = rotation_grad(x, cos, sin)
    device = rotation_device(x, cos, sin, grad)
    computes_in, kernels = dispatch.rotation_plan(device, x.dtype, grad)
    if computes_in is not None and computes_in != x.dtype:  # bf16/fp16: rotate in float32, round once
        return apply_rotary(x.to(computes_in), cos, sin, interleaved).to(x.dtype)
    # The Triton kernel keeps its tables float32; every other kernel reads them in x's dtype. (Compared here: a
    # no-op .to() is still an operator call, and a decode step rotates in every layer.)
    if device != "cuda" and (cos.dtype != x.dtype or sin.dtype != x.dtype):
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if kernels[0] in ("formula", "rotation_function"):  # autograd's formula, or the rest of the row inside _Rotate
        return ROTATION_KERNELS[kernels[0]](x, cos, sin, interleaved, kernels[1:])
    return _first_served(kernels, x, cos, sin, interleaved, 1.0)  # grad none: the plan just asked is _rotate's


def rotate_pair(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False,
                cos_k: Tensor | None = None, sin_k: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """apply_rotary of q (B,H,T,Dh) by cos, sin and of k (B,Hkv,T,Dh) by cos_k, sin_k (default: the same), as one
    tensor's two views (a decode step's own rows: one operator for both). Where the rotation table's first kernel
    for them is the native one, it writes both without concatenating them first."""
    cos_k, sin_k = (cos, sin) if cos_k is None else (cos_k, sin_k)
    no_grad = rotation_grad(q, cos, sin) == rotation_grad(k, cos_k, sin_k) == "none"
    if no_grad and dispatch.rotation_plan(rotation_device(q, cos, sin, "none"), q.dtype, "none")[1][0] == "native":
        pair = _fast.rotate_pair_native(q, k, cos, sin, interleaved, cos_k, sin_k)
        if pair is not None:
            return pair
    if cos_k is not cos or sin_k is not sin:
        return apply_rotary(q, cos, sin, interleaved), apply_rotary(k, cos_k, sin_k, interleaved)
    both = apply_rotary(torch.cat((q, k), dim=1), cos, sin, interleaved)  # (B,H+Hkv,T,Dh)
    return both.split((q.shape[1], k.shape[1]), dim=1)


def rotation_grad(x: Tensor, cos: Tensor, sin: Tensor) -> str:
    """The grad of the rotation's key: tables (cos/sin carry parameters), x (a gradient to x only), or none."""
    if not torch.is_grad_enabled():
        return "none"
    if cos.requires_grad or sin.requires_grad:
        return "tables"
    return "x" if x.requires_grad else "none"


def rotation_device(x: Tensor, cos: Tensor, sin: Tensor, grad: str) -> str:
    """The device of the rotation's key: traced while torch.compile traces, cuda where the Triton kernel takes x
    with these tables (and they are not learned), cpu for another CPU tensor, other for the rest."""
    if torch.compiler.is_compiling():  # traced by torch.compile (a compiled decode step): no native code, no out=
        return "traced"
    if x.is_cpu and not gpu.interpreting():  # the common case first: Triton serves no CPU tensor but the interpreter's
        return "cpu"
    if grad != "tables" and _fast.triton_fits(x, cos, sin):
        return "cuda"
    return "cpu" if x.is_cpu else "other"


class _Rotate(torch.autograd.Function):
    """kernels: the rest of the row of x's key with a gradient, (rotation_function, *kernels): what the row without
    a gradient holds for the same device and dtype (dispatch.rotation_plan), so the forward asks no table again."""

    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, kernels: tuple[str, ...]) -> Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.interleaved = interleaved
        ctx.kernels = kernels
        return _first_served(kernels, x, cos, sin, interleaved, 1.0)

    @staticmethod
    def backward(ctx, grad: Tensor):
        cos, sin = ctx.saved_tensors
        # grad has x's shape, dtype and device (autograd casts it to them), which is all the row's key reads: the
        # forward's row serves it, without asking the table again (host time, per layer and step).
        out = _first_served(ctx.kernels, grad, cos, sin, ctx.interleaved, -1.0)  # R^T = R(-theta)
        return out, None, None, None, None


def _plain_kernels(x: Tensor, cos: Tensor, sin: Tensor) -> tuple[str, ...]:
    """The kernels of the rotation table's row for x's key without a gradient."""
    return dispatch.rotation_plan(rotation_device(x, cos, sin, "none"), x.dtype, "none")[1]


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, sign: float = 1.0) -> Tensor:
    """No autograd: the kernels of the rotation table for x's key without a gradient, the first that serves."""
    return _first_served(_plain_kernels(x, cos, sin), x, cos, sin, interleaved, sign)


def _first_served(kernels: tuple[str, ...], x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool,
                  sign: float) -> Tensor:
    for name in kernels:
        out = ROTATION_KERNELS[name](x, cos, sin, interleaved, sign)
        if out is not None:
            return out
    raise RuntimeError(f"no rotation kernel served (tried {', '.join(kernels)}); eager always serves")


def _signed(sin: Tensor, sign: float) -> Tensor:
    return sin if sign > 0 else -sin


def _complex(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, sign: float) -> Tensor | None:
    """Interleaved pairs are complex numbers in memory already: one complex multiply (float32/64, even strides)."""
    if interleaved and _fast.can_use_complex(x):
        return _fast.rotate_interleaved_complex(x, cos, _signed(sin, sign))
    return None


def _compiled(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, sign: float) -> Tensor | None:
    """Half-split pairs through the torch.compile'd kernel, for tensors large enough to repay compiling it."""
    if not interleaved and x.numel() >= _fast.COMPILE_MIN_ELEMENTS:
        return _fast.rotate_half_split_compiled(x, cos, _signed(sin, sign))
    return None


def _eager(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, sign: float) -> Tensor:
    """Each half written once into a fresh output."""
    sin = _signed(sin, sign)
    rot_dim = 2 * cos.shape[-1]
    x1, x2 = _pairs(x, rot_dim, interleaved)
    out = torch.empty_like(x)
    o1, o2 = _pairs(out, rot_dim, interleaved)
    torch.mul(x1, cos, out=o1)
    o1.addcmul_(x2, sin, value=-1.0)  # x1 cos - x2 sin
    torch.mul(x2, cos, out=o2)
    o2.addcmul_(x1, sin)  # x2 cos + x1 sin
    if rot_dim < x.shape[-1]:
        out[..., rot_dim:] = x[..., rot_dim:]
    return out


def _traced(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, sign: float) -> Tensor:
    """The formula as plain operators, for torch.compile to trace and fuse (it traces no native call and no write
    into an out= view); the products and sums round as _eager's do."""
    return apply_rotary_autograd(x, cos, _signed(sin, sign), interleaved)


def apply_rotary_autograd(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """The plain formula, differentiated by autograd: the reference for apply_rotary's gradients."""
    rot_dim = 2 * cos.shape[-1]
    x1, x2 = _pairs(x, rot_dim, interleaved)
    r1 = x1 * cos - x2 * sin
    r2 = x2 * cos + x1 * sin
    if interleaved:  # (.., R/2, 2) -> (.., R): re-interleave the pairs
        rotated = torch.stack((r1, r2), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((r1, r2), dim=-1)
    if rot_dim == x.shape[-1]:
        return rotated
    return torch.cat((rotated, x[..., rot_dim:]), dim=-1)


# The functions posenc.nn.dispatch's rotation table names: (x, cos, sin, interleaved, sign) -> Tensor | None for a
# kernel; (x, cos, sin, interleaved, the rest of the row) -> Tensor for the two that wrap autograd around a row.
# Each looks its kernel up in _fast at the call, so a test can replace one there.
ROTATION_KERNELS: dict[str, Callable[..., Tensor | None]] = {
    "native": lambda x, cos, sin, interleaved, sign: _fast.rotate_native(x, cos, sin, interleaved, sign),
    "triton": lambda x, cos, sin, interleaved, sign: _fast.rotate_triton(x, cos, sin, interleaved, sign),
    "complex": _complex,
    "compiled": _compiled,
    "eager": _eager,
    "traced": _traced,
    "rotation_function": lambda x, cos, sin, interleaved, kernels: _Rotate.apply(x, cos, sin, interleaved, kernels),
    "formula": lambda x, cos, sin, interleaved, kernels: apply_rotary_autograd(x, cos, sin, interleaved),
}


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
