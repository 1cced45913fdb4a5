"""Run posenc's Triton kernels on the CPU through Triton's interpreter (TRITON_INTERPRET=1).

Triton reads the setting when it is imported (its own library functions, tl.zeros among them, are decorated
then) and when each kernel is decorated, so the kernels cannot switch to the interpreter inside a process that
imported Triton already (torch.compile does). The kernel tests (tests/nn/triton_cases.py) therefore run in a
fresh Python process with the setting made before anything imports Triton."""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[2]


TIMEOUT = float(os.environ.get("POSENC_TRITON_TEST_TIMEOUT", 900))
# POSENC_EMULATE_TF32=1 with TRITON_INTERPRET=1: the interpreter's tl.dot truncates float32 operands to TF32 as the
# GPU's does, and the compiled bound (within_reach) applies: the case files' precision checks run on the CPU.
EMULATE_TF32 = os.environ.get("POSENC_EMULATE_TF32") == "1"


def run_interpreted(*test_files: Path, timeout: float = TIMEOUT) -> None:
    """Run the files' tests under the interpreter in one fresh process; fail with its report if any fails."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    names = ", ".join(f.name for f in test_files)
    command = [sys.executable, "-m", "pytest", "-v", "-x", "-p", "no:cacheprovider", "-p", "no:xdist",
               "--durations=5", *map(str, test_files)]
    try:
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        output = (err.stdout or b"").decode(errors="replace")[-8000:]
        pytest.fail(f"{names} under TRITON_INTERPRET=1 ran past {timeout:.0f} s:\n{output}", pytrace=False)
    if result.returncode != 0:
        pytest.fail(f"{names} under TRITON_INTERPRET=1 failed:\n{result.stdout[-8000:]}\n"
                    f"{result.stderr[-2000:]}", pytrace=False)


def patch_interpreter_for_numpy() -> None:
    """Triton 3.6's interpreter turns a scalar into a Python int with int(array of shape (1,)), which NumPy 2.4
    refuses ('only 0-dimensional arrays can be converted'): a loop bound computed in a kernel then fails. The
    compiled kernels never see NumPy; only the interpreter needs this. Call before any kernel runs."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "posenc_patched", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.posenc_patched = True
    interpreter._patch_lang_tensor = patched


def patch_interpreter_nested_calls() -> None:
    """Triton 3.6's interpreter patches triton.language (every builtin of tl, tl.core, tl.math and tl.tensor, found
    by inspect.getmembers) at each launch, and again at every call of a @triton.jit helper inside the kernel, in a
    scope it never restores. Inside a launch the language is patched already: a helper whose module sees only the
    language modules the launch patched finds nothing left to wrap (its members are the launch's wrappers), yet the
    search cost about a third of the interpreted cases' time (5 of 20 s of a GPU-tile case, profiled; 35% less CPU
    time without it, A/B in one process). Such a call skips the pass; a helper that sees another language module
    (Triton's own tl.sum, whose module sees tl.core) takes Triton's pass; the launch's own patch and its restore
    are Triton's. Without these internals (another Triton) nothing changes. Call before any kernel runs."""
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang", None)
    if original is None or getattr(original, "posenc_patched", False) or not hasattr(interpreter, "_LangPatchScope"):
        return
    held: set[int] = set()  # ids of the language modules the running launch patched
    languages: dict[object, frozenset[int]] = {}  # a jit function -> ids of the language modules its module sees

    def languages_of(fn) -> frozenset[int]:
        if fn not in languages:
            langs = (interpreter.tl, interpreter.tl.core)
            languages[fn] = frozenset(id(v) for v in fn.__globals__.values() if any(v is lang for lang in langs))
        return languages[fn]

    def patched(fn):
        seen = languages_of(fn)
        if held and seen <= held:  # a helper inside a launch: the language is patched already
            return interpreter._LangPatchScope()
        outer = not held
        scope = original(fn)
        held.update(seen)
        if outer:  # the launch's scope: its restore ends the launch
            restore = scope.restore

            def restored() -> None:
                held.clear()
                restore()

            scope.restore = restored
        return scope

    patched.posenc_patched = True
    interpreter._patch_lang = patched


def patch_interpreter_dtype_table() -> None:
    """Triton 3.6's interpreter maps a Triton dtype to numpy's (_get_np_dtype) by building a dict of 19 dtypes,
    each hashed, at every call: at every cast, splat and masked load, about 8% of the interpreted cases' time
    (profiled). The same answers, each looked up once per scalar dtype (a block's element dtype's, a pointer's
    uint64, as the original gives them). Without this internal (another Triton) nothing changes."""
    import numpy as np
    from triton.runtime import interpreter

    original = getattr(interpreter, "_get_np_dtype", None)
    if original is None or getattr(original, "posenc_patched", False):
        return
    tl = interpreter.tl
    found: dict[object, np.dtype] = {}

    def cached(tt_dtype):
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(scalar, tl.pointer_type):
            return np.dtype(np.uint64)
        if scalar not in found:
            found[scalar] = original(scalar)
        return found[scalar]

    cached.posenc_patched = True
    interpreter._get_np_dtype = cached


def as_tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 as a tensor core reads it for a TF32 product: the top 10 of 23 mantissa bits, the rest dropped
    (truncated, not rounded: Triton 3.6 hands float32 registers to mma / wgmma .tf32 with no cvt.rna.tf32 before,
    read in its sm_80 and sm_90 PTX; cuBLAS rounds). Products of two such values are exact in float32."""
    return (t.view(torch.int32) & -8192).view(torch.float32)  # -8192 = ~0x1fff: the 13 low mantissa bits cleared


def exact_float32() -> bool:
    """tl.dot multiplies float32 exactly: under the interpreter, unless POSENC_EMULATE_TF32=1."""
    from posenc.nn import triton as gpu

    return gpu.interpreting() and not EMULATE_TF32


def patch_interpreter_for_tf32() -> None:
    """The interpreter's tl.dot with float32 operands truncated to TF32 (as_tf32()), as the compiled kernels' dot
    multiplies them on a GPU (attention.precision: "tf32"); the kernels ask the interpreter for "ieee"."""
    import numpy as np
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot
    if getattr(original, "posenc_patched", False):
        return

    def truncated(handle):
        if handle.data.dtype != np.float32:
            return handle
        return interpreter.TensorHandle((handle.data.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32),
                                        handle.dtype)

    def patched(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, truncated(a), truncated(b), d, input_precision, max_num_imprecise_acc)

    patched.posenc_patched = True
    interpreter.InterpreterBuilder.create_dot = patched
    # and the kernels told that their products are TF32, as compiled: they round what a GPU would truncate
    # (attention_kernels._nearest_tf32, attention.output_gradient_and_delta)
    from posenc.nn.triton import attention

    attention.precision = lambda dtype, interpreted: "tf32"


_PRODUCTS = frozenset({"mm", "bmm", "addmm", "baddbmm", "mv", "addmv", "dot"})  # aten's matrix products


class _TF32Products(TorchDispatchMode):
    """Every float32 matrix product run inside (forward and autograd's backward alike) on TF32 operands."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in _PRODUCTS:
            first = 1 if func.overloadpacket.__name__.startswith("add") else 0  # addmm(bias, a, b): a and b
            args = tuple(as_tf32(a) if first <= n < first + 2 and isinstance(a, torch.Tensor) and
                         a.dtype == torch.float32 else a for n, a in enumerate(args))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def at_kernel_precision() -> Iterator[None]:
    """The low reference's float32 products as the kernels' tl.dot makes them where it is not exact (compiled, or
    emulated): on TF32 operands (as_tf32()), in its forward and in autograd's backward run inside. torch's own TF32
    (set_float32_matmul_precision("high")) is no such reference: cuBLAS keeps float32 on CUDA cores for small or
    one-row products (a decode step's; measured on an H200 with torch 2.11: errors of 2e-6, TF32's are 1e-3), and
    the CPU has none. 16-bit and float64 products are untouched."""
    if exact_float32():
        yield
        return
    with _TF32Products():
        yield


def kernel_device(tf32: bool = False) -> tuple[bool, str]:
    """The case files' common start, called at import: (interpreted, device). Under TRITON_INTERPRET=1 the
    interpreter is patched and the kernels run on "cpu"; otherwise they run compiled on "cuda", and the whole
    file is skipped where there is no CUDA device. tf32=True: torch allows TF32 (set_float32_matmul_precision
    "high"), without which the dispatch does not send float32 to the kernels (attention.serves_float32). The low
    references' precision is at_kernel_precision's, not this setting's."""
    from posenc.nn import triton as gpu

    if gpu.interpreting():
        patch_interpreter_for_numpy()
        patch_interpreter_nested_calls()
        patch_interpreter_dtype_table()
        if EMULATE_TF32:
            patch_interpreter_for_tf32()
        return True, "cpu"
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device and TRITON_INTERPRET is not set", allow_module_level=True)
    if tf32:
        torch.set_float32_matmul_precision("high")
    return False, "cuda"


# FlashAttention's test rule (Dao-AILab/flash-attention tests/test_flash_attn.py): a kernel's largest error against
# the exact reference may be at most FACTOR times the largest error that the same reference formula makes at the
# kernel's own precision ("low"). They use 2; we use 3 because our kernels and the low reference round in different
# places: the kernels round P and dO to the nearest TF32 value where the low reference truncates every operand (as
# Triton's dot does, triton-lang/triton#4574; attention_kernels._nearest_tf32 says why the kernels round), they
# multiply a bias or a position table in other orders (CoPE's gates summed per tile), and FIRE's and CoPE's
# parameter gradients sum dS over whole segments. Measured with TF32 emulated on the CPU (POSENC_EMULATE_TF32=1, each
# test at its interpreter sizes): the kernels' errors reach 2.2x the low reference's (Shaw's encoder dtable 0.0050
# against 0.0023). Before the kernels rounded: 2.6x (CoPE's one_position dtable 0.0179 against 0.0069, now 0.5x;
# Transformer-XL's dtable 0.0167 against 0.0083, which the H200 measured too) and KERPLE's dkerple_a 7.3x.
FACTOR = 3


class SoftmaxTimesValues(torch.autograd.Function):
    """softmax(logits) v (logits (B,H,Tq,Tk), v (B,H,Tk,Dh) -> (B,H,Tq,Dh)), P cast to v's dtype as the kernels cast
    it, differentiated as FlashAttention's backward (and ours) does: dS = P (dP - D) with D = rowsum(dO * O), where
    autograd's softmax takes rowsum(P dP). The two agree exactly; at TF32 or bf16 they differ by the rounding of
    O = P V, and D's error moves every logit of a query alike: a parameter that shifts them all (FIRE's output bias,
    a one-row CoPE table), whose exact gradient is 0, gets the kernel's error only from this backward."""

    @staticmethod
    def forward(ctx, logits, v):
        p = torch.softmax(logits, -1)
        out = p.to(v.dtype) @ v
        ctx.save_for_backward(p, v, out)
        return out

    @staticmethod
    def backward(ctx, d_out):
        p, v, out = ctx.saved_tensors
        wide = torch.promote_types(p.dtype, torch.float32)
        d_v = p.to(v.dtype).transpose(-1, -2) @ d_out
        d_p = d_out @ v.transpose(-1, -2)  # (B,H,Tq,Tk)
        delta = (d_out.to(wide) * out.to(wide)).sum(-1, keepdim=True)  # (B,H,Tq,1)
        return (p.to(wide) * (d_p.to(wide) - delta)).to(p.dtype), d_v


def attention_reference(q, k, v, bias, causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh) + bias + mask) v in q's dtype, written out (in float32 the matmuls run as TF32 on a
    GPU, as the kernels' do; SDPA's fused float32 kernels would not), with the kernels' backward
    (SoftmaxTimesValues). q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh), bias (B|1,H,Tq,Tk) or None -> (B,H,Tq,Dh)."""
    h, tq, tk = q.shape[1], q.shape[2], k.shape[2]
    k, v = (t.repeat_interleave(h // t.shape[1], 1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5  # (B,H,Tq,Tk)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if causal and tq > 1:  # query i is key i + Tk - Tq
        future = torch.ones(tq, tk, dtype=torch.bool, device=q.device).triu(tk - tq + 1)
        scores = scores.masked_fill(future, float("-inf"))
    return SoftmaxTimesValues.apply(scores, v)


def twins(tensors, dtype: torch.dtype = torch.float64) -> list[torch.Tensor]:
    """Fresh leaves holding the tensors' values in `dtype`: the exact reference's own inputs."""
    return [t.detach().to(dtype).requires_grad_() for t in tensors]


def within_reach(actual: torch.Tensor, exact: torch.Tensor, low: torch.Tensor, floor: float, what: str) -> None:
    """Compiled: the kernel's largest error against the float64 reference `exact` is at most FACTOR x the largest
    error of `low`, the same formula at the kernel's precision (float32 products on TF32 operands, computed inside
    at_kernel_precision; 16-bit inputs computed in their own type, as FlashAttention's upcast=False), and never has
    to be below `floor` x max(1, max|exact|), the fixed tolerance these tests had (gradients of a shared row or
    parameter sum many terms). Where tl.dot multiplies float32 exactly (the interpreter, unless POSENC_EMULATE_TF32
    is set) the bound stays that fixed tolerance: FACTOR x low was below it in every comparison, and a 16-bit low
    reference would loosen it (measured: 3.2x on Transformer-XL's bf16 output)."""
    exact = exact.detach().double()
    error = (actual.detach().double() - exact).abs().max().item()
    low_error = (low.detach().double() - exact).abs().max().item()
    fixed = floor * max(1.0, exact.abs().max().item())
    interpreted = exact_float32()
    bound = fixed if interpreted else max(FACTOR * low_error, fixed)
    assert error <= bound, (f"{what}: kernel's max error {error:.3g} > bound {bound:.3g} (the reference at the "
                            f"kernel's precision errs by {low_error:.3g}, x{FACTOR} = {FACTOR * low_error:.3g}; "
                            f"fixed tolerance {fixed:.3g}{', the bound under the interpreter' if interpreted else ''})")


def all_within_reach(names, actual, exact, low, floor: float, what: str = "") -> None:
    """within_reach for each (name, kernel's, exact, low) tensor of parallel lists: an output's gradients."""
    for name, a, e, lo in zip(names, actual, exact, low, strict=True):
        within_reach(a, e, lo, floor, f"{what} {name}".strip())


# float32's sums: a kernel's sum of n float32 terms errs by at most about n eps |terms| (pairwise or tiled sums far
# less); measured, the head kernel's parameter gradients err by at most 0.17 eps x the size below (interpreter,
# KERPLE log and power, bf16), and a compiled kernel's exp2 and float32 log-sum-exp add a few eps per probability.
SUM_FACTOR = 32


def head_parameter_gradients_given_output(scheme, q, k, v, q_pos, k_pos, causal: bool, out, dout):
    """float64: the gradients of the scheme's per-head parameters (each of shape (H,): every bias entry reads its own
    head's) by the backward the kernels run, FlashAttention-2's dS = P (dP - D), with D = rowsum(dO * O) read from
    `out`, the kernel's own output. In 16 bits O is rounded and D with it, which moves every logit of a query alike:
    a parameter's gradient sums that over every pair, weighted by d bias / d parameter (KERPLE's b in bf16: 17% of
    the gradient in a tiny GPT, 3% at the head kernel's test sizes), an error of the backward's formula, not of the
    kernel's arithmetic, which this reference shares so that a wrong derivative row shows. Also, per parameter
    element, size = sum over pairs of P (|dP| + |D|) |d bias / d parameter|: what the kernel's float32 sum adds up.
    q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh), out/dout (B,H,Tq,Dh) -> [(gradient (H,), size (H,))] per learnable parameter."""
    scheme = copy.deepcopy(scheme).double()
    params = [p for p in scheme.parameters() if p.requires_grad]
    q, k, v, out, dout = (t.detach().double() for t in (q, k, v, out, dout))
    h, tq, tk = q.shape[1], q.shape[2], k.shape[2]
    k, v = (t.repeat_interleave(h // t.shape[1], 1) for t in (k, v))
    bias = scheme.bias(q_pos, k_pos)  # (B|1,H,Tq,Tk)
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + bias
    if causal and tq > 1:  # query i is key i + Tk - Tq
        scores = scores.masked_fill(torch.ones(tq, tk, dtype=torch.bool, device=q.device).triu(tk - tq + 1),
                                    float("-inf"))
    p = torch.softmax(scores, -1)
    d_p = dout @ v.transpose(-1, -2)  # (B,H,Tq,Tk)
    delta = (dout * out).sum(-1, keepdim=True)  # (B,H,Tq,1)
    weight = p * (d_p.abs() + delta.abs())
    found = []
    for param in params:
        assert param.shape == (h,), f"a parameter per head, not {tuple(param.shape)}"
        (gradient,) = torch.autograd.grad(scores, param, p * (d_p - delta), retain_graph=True)
        tangent = torch.zeros_like(bias, requires_grad=True)  # d bias / d param per entry: the linear map's transpose
        (through,) = torch.autograd.grad(bias, param, tangent, create_graph=True, retain_graph=True)
        (jacobian,) = torch.autograd.grad(through.sum(), tangent, retain_graph=True)  # (B|1,H,Tq,Tk)
        found.append((gradient, (weight * jacobian.abs()).sum((0, 2, 3))))
    return found


def within_float32_sums(actual: torch.Tensor, reference: torch.Tensor, size: torch.Tensor, what: str) -> None:
    """Each element of `actual` within SUM_FACTOR float32 epsilons of its sum's size of `reference`."""
    error = (actual.detach().double() - reference).abs()
    bound = SUM_FACTOR * torch.finfo(torch.float32).eps * size
    worst = int((error / bound).argmax())
    assert (error <= bound).all(), (f"{what}: element {worst} errs by {error[worst]:.3g} > {SUM_FACTOR} float32 eps "
                                    f"x its sum's size {size[worst]:.3g} = {bound[worst]:.3g} (the gradient: "
                                    f"{reference[worst]:.4g})")


GROUP_SCALES = (256.0, -128.0, -128.0, 1.0)  # d_h: powers of two that sum to 1


def gqa_group_with_large_partials(length: int, head_dim: int, dtype: torch.dtype, device: str,
                                  generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """q (1,4,T,Dh), k and v (1,1,T,Dh) leaves and dO (1,4,T,Dh), in dtype: a 4:1 GQA group whose heads' dK and dV
    partials are up to 256x their sum. Adding the heads' partials in float32 and rounding once leaves dK and dV
    within the 16-bit tolerance of the float64 reference; partials kept in 16 bits each lose 2^-9 (bf16) or 2^-12
    (fp16) of 256x the result.
    The heads see the same q . k (q's first half is shared; its second half, q_h = c_h u, meets k's zeros); the
    caller makes the scheme's bias the same for every head too (one row, equal parameters, or a table read by q's
    first half alone). Their dS then differ by the power of two d_h alone (dO_h = d_h dO in v's half), bit for bit
    after the kernels round dS to 16 bits, and
        dK = (sum d_h) A + (sum d_h c_h) B = A,   dV = (sum d_h) P^T dO + (sum e_h) P^T w = P^T dO
    with dO_h's second half e_h w (v is zero there): sums of non-power-of-two multiples of one value, no longer 0
    once each is rounded (power-of-two multiples round alike and would cancel). Every value is exact in bf16 and
    fp16 but the random halves, which every head rounds alike."""
    half = head_dim // 2
    d = torch.tensor(GROUP_SCALES)[:, None, None]
    c = torch.tensor([1.0, 1.5, 0.5, 0.0])[:, None, None]  # sum of d_h c_h = 0
    e = torch.tensor([96.0, -40.0, -56.0, 0.0])[:, None, None]  # sums to 0
    u, w = (torch.randint(-2, 3, (length, half), generator=generator) / 2 for _ in range(2))  # times c_h, e_h: exact
    q = torch.cat((torch.randn(length, half, generator=generator).expand(4, length, half), c * u), -1)[None]
    k, v = (torch.cat((torch.randn(1, 1, length, half, generator=generator), torch.zeros(1, 1, length, half)), -1)
            for _ in range(2))
    dout = torch.cat((d * torch.randn(length, half, generator=generator), e * w), -1)[None]
    return (*(x.to(device, dtype).requires_grad_() for x in (q, k, v)), dout.to(device, dtype))


def key_gradients_within(fast, exact, floor: float, what: str) -> None:
    """dK and dV (fast: the kernel's, exact: float64's) within floor x max(1, max|exact|), the fixed 16-bit
    tolerance: not within_reach's bound, whose low reference (autograd in 16 bits) rounds each head's partial to 16
    bits itself and would let the kernel do the same on a GPU."""
    for name, actual, x in zip(("dk", "dv"), fast, exact, strict=True):
        error, bound = (actual.double() - x).abs().max().item(), floor * max(1.0, x.abs().max().item())
        assert error <= bound, f"{what} {name}: max error {error:.3g} > {bound:.3g} (the group's partials in 16 bits?)"
