"""Which RoPE kernel runs, and that each equals the float64 reference: float64 tensors (the native
float32 kernel declines them) reach the complex kernel (interleaved) or, from COMPILE_MIN_ELEMENTS on,
the compiled half-split kernel; tensors the complex view cannot take (odd strides, other dtypes) do not;
a failed compile warns once, naming the error, and falls back to the eager path for good."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import posenc
from posenc.nn import native as native_kernels
from posenc.rotary import _core, _fast
from posenc.rotary._core import apply_rotary, apply_rotary_autograd, apply_rotary_reference, cos_sin, inv_frequencies
from tests.conftest import tiny_gpt


def case(shape: tuple[int, ...], rot: int, dtype=torch.float64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=dtype)
    pos = torch.randint(0, 100_000, (shape[0], shape[2]), generator=g)
    inv_freq = inv_frequencies(rot, 10000.0)
    return x, pos, inv_freq, *cos_sin(pos, inv_freq)


def test_complex_kernel_in_float64_equals_the_reference():
    x, pos, inv_freq, cos, sin = case((2, 3, 5, 16), 16)
    out = _fast.rotate_interleaved_complex(x, cos, sin)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, apply_rotary_reference(x, pos, inv_freq, True), rtol=1e-6, atol=1e-6)


def odd_strided(dtype=torch.float64) -> torch.Tensor:
    """(2,3,4,32) whose first two strides are even and the third odd: no complex view possible."""
    return torch.randn(2, 3, 4, 33, dtype=dtype)[..., :32]


def test_complex_view_only_where_torch_allows_it():
    assert _fast.can_use_complex(torch.randn(2, 3, 4, 32, dtype=torch.float64))
    assert not _fast.can_use_complex(odd_strided())  # strides (396, 132, 33, 1)
    assert not _fast.can_use_complex(torch.randn(2, 3, 4, 32, dtype=torch.float32)[..., ::2])  # stride(-1) = 2
    assert not _fast.can_use_complex(torch.randn(2, 3, 4, 32, dtype=torch.float32).to(torch.bfloat16))
    assert not _fast.can_use_complex(torch.randn(2, 3, 4, 32).to(torch.float16))


@pytest.mark.parametrize("interleaved", [True, False])
def test_odd_strided_input_rotates_like_the_reference(interleaved):
    x = odd_strided()
    pos = torch.randint(0, 1000, (2, 4))
    inv_freq = inv_frequencies(24, 10000.0)
    out = apply_rotary(x, *cos_sin(pos, inv_freq), interleaved)
    torch.testing.assert_close(out, apply_rotary_reference(x, pos, inv_freq, interleaved), rtol=1e-6, atol=1e-6)


@pytest.fixture
def stand_in_compile(monkeypatch):
    """torch.compile replaced by the identity (the kernel runs eagerly), from a fresh process state."""
    calls = []

    def fake_compile(fn, **kwargs):
        calls.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(_fast, "_compiled", None)
    monkeypatch.setattr(_fast, "_compile_failed", False)
    return calls


def test_large_half_split_tensors_take_the_compiled_kernel(stand_in_compile, monkeypatch):
    x, pos, inv_freq, cos, sin = case((1, 2, 8, 32), 24)
    monkeypatch.setattr(_fast, "COMPILE_MIN_ELEMENTS", x.numel())  # exactly at the threshold
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a silent fallback would warn
        out = _core._rotate(x, cos, sin, False)
        again = _core._rotate(x, cos, sin, False)  # compiled once, reused
    assert stand_in_compile == [_fast._half_split] and not _fast._compile_failed
    want = apply_rotary_reference(x, pos, inv_freq, False)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(again, want, rtol=1e-6, atol=1e-6)
    back = _core._rotate(out, cos, sin, False, sign=-1.0)  # the backward's rotation by -theta
    torch.testing.assert_close(back, x, rtol=1e-6, atol=1e-6)


def test_a_failed_compile_warns_once_and_falls_back(monkeypatch):
    def broken_compile(fn, **kwargs):
        raise RuntimeError("no compiler")

    monkeypatch.setattr(torch, "compile", broken_compile)
    monkeypatch.setattr(_fast, "_compiled", None)
    monkeypatch.setattr(_fast, "_compile_failed", False)
    x, pos, inv_freq, cos, sin = case((1, 2, 8, 32), 32)
    monkeypatch.setattr(_fast, "COMPILE_MIN_ELEMENTS", 1)
    with pytest.warns(UserWarning, match=r"compiled RoPE unavailable \(RuntimeError\)") as caught:
        first = apply_rotary(x, cos, sin, False)
        second = apply_rotary(x, cos, sin, False)
    assert len(caught) == 1 and _fast._compile_failed
    want = apply_rotary_reference(x, pos, inv_freq, False)
    torch.testing.assert_close(first, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(second, want, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.skipif("mutants" in Path(posenc.__file__).parts,
                    reason="under mutmut every function is a trampoline, which dynamo cannot compile")
def test_real_compiled_kernel_through_apply_rotary_equals_the_reference(monkeypatch):
    x, pos, inv_freq, cos, sin = case((1, 2, 16, 32), 24)
    monkeypatch.setattr(_fast, "COMPILE_MIN_ELEMENTS", 1)
    if _fast._compile_failed:
        pytest.skip("torch.compile unavailable in this process")
    out = apply_rotary(x, cos, sin, False)
    assert _fast._compiled is not None and not _fast._compile_failed
    torch.testing.assert_close(out, apply_rotary_reference(x, pos, inv_freq, False), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("interleaved", [None, True, False])  # None: the default, half-split as apply_rotary's
def test_autograd_formula_keeps_unrotated_dims_when_heads_and_length_equal_rot_dim(interleaved):
    """rot_dim 16 < head_dim 32 with H = T = 16: only the last dim may decide what passes through."""
    x, pos, inv_freq, cos, sin = case((1, 16, 16, 32), 16)
    args = () if interleaved is None else (interleaved,)
    out = apply_rotary_autograd(x, cos, sin, *args)
    assert out.shape == x.shape
    torch.testing.assert_close(out, apply_rotary_reference(x, pos, inv_freq, bool(interleaved)), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out, apply_rotary(x, cos, sin, *args), rtol=1e-6, atol=1e-6)



@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize(("heads", "kv_heads", "rot", "batch_tables"), [(4, 4, 16, False), (6, 2, 12, True)])
def test_a_decode_steps_q_and_k_rotate_in_one_output_like_the_reference(interleaved, heads, kv_heads, rot,
                                                                         batch_tables, monkeypatch):
    """rotate_pair: the native kernel writes q's and k's rows into one tensor (no concatenation first), any layout:
    q a strided view of a projection, GQA, a partial rotation, tables per batch row or shared."""
    if native_kernels.library() is None:
        pytest.skip("no native kernels here (POSENC_NATIVE=0 or no compiler)")
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 1, heads, 16, generator=g).transpose(1, 2)  # (B,H,1,Dh) as a projection's view
    k = torch.randn(2, 1, kv_heads, 16, generator=g).transpose(1, 2)
    pos = torch.tensor([[7], [300]]) if batch_tables else torch.tensor([[41]]).expand(2, 1)
    inv_freq = inv_frequencies(rot, 10000.0)
    cos, sin = (t.float() for t in cos_sin(pos if batch_tables else pos[:1], inv_freq))
    served, native = [], _fast.rotate_pair_native
    monkeypatch.setattr(_fast, "rotate_pair_native", lambda *args: served.append(native(*args)) or served[-1])
    with torch.no_grad():
        rq, rk = _core.rotate_pair(q, k, cos, sin, interleaved)
    assert served and served[-1] is not None  # the native pair kernel rotated them, not the concatenated path
    assert rq.shape == q.shape and rk.shape == k.shape
    for x, out in ((q, rq), (k, rk)):
        reference = apply_rotary_reference(x.double(), pos, inv_freq, interleaved)
        torch.testing.assert_close(out, reference.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("native", [True, False], ids=["native", "pytorch"])
def test_a_pair_with_the_keys_own_tables_rotates_each_by_its_own(native, monkeypatch):
    """xPos's decode step: q by tables scaled up, k by tables scaled down (here: other angles and scales, per batch
    row for k), in one native call or, where it does not serve, one rotation each: equal to apply_rotary of each by
    its own tables, bit for bit. And xPos's rotate() of a decode step takes this path."""
    if native and native_kernels.library() is None:
        pytest.skip("no native kernels here (POSENC_NATIVE=0 or no compiler)")
    g = torch.Generator().manual_seed(9)
    q, k = torch.randn(2, 6, 1, 16, generator=g), torch.randn(2, 2, 1, 16, generator=g)
    inv_freq = inv_frequencies(16, 10000.0)
    cos_q, sin_q = (t.float() * 1.5 for t in cos_sin(torch.tensor([[41]]), inv_freq))
    cos_k, sin_k = (t.float() / 1.5 for t in cos_sin(torch.tensor([[7], [300]]), inv_freq))
    served, pair = [], _fast.rotate_pair_native
    monkeypatch.setattr(_fast, "rotate_pair_native",
                        lambda *args: served.append(pair(*args) if native else None) or served[-1])
    with torch.no_grad():
        rq, rk = _core.rotate_pair(q, k, cos_q, sin_q, False, cos_k, sin_k)
    assert (served[-1] is not None) == native
    torch.testing.assert_close(rq, apply_rotary(q, cos_q, sin_q), rtol=0, atol=0)
    torch.testing.assert_close(rk, apply_rotary(k, cos_k, sin_k), rtol=0, atol=0)
    model = tiny_gpt("xpos")
    served.clear()
    with torch.no_grad():
        cache = model.new_cache()
        model(torch.tensor([[1, 2, 3]]), cache=cache)
        model(torch.tensor([[4]]), cache=cache)
    assert served, "xPos's decode step did not rotate q and k as a pair"


def test_a_pair_the_native_kernel_does_not_take_is_rotated_all_the_same():
    """bf16 (rotated in float32 by apply_rotary), or a gradient wanted: the concatenated path, equal to one by one."""
    q, k = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 1, 8)
    cos, sin = (t.float() for t in cos_sin(torch.tensor([[3]]), inv_frequencies(8, 10000.0)))
    for a, b in ((q.bfloat16(), k.bfloat16()), (q.requires_grad_(), k)):
        rq, rk = _core.rotate_pair(a, b, cos, sin)
        torch.testing.assert_close(rq, apply_rotary(a, cos, sin), rtol=0, atol=0)
        torch.testing.assert_close(rk, apply_rotary(b, cos, sin), rtol=0, atol=0)


@pytest.mark.parametrize("interleaved", [False, True], ids=["half_split", "interleaved"])
def test_the_native_kernel_rounds_as_the_eager_kernel_and_a_decode_steps_turns(interleaved):
    """float32 on the CPU: the native kernel's every bit equals the eager kernel's (x1 c rounded, then one fma with
    x2 s: torch's mul and addcmul) and a mapped decode step's Turns' (addcmul), forwards and backwards, partial
    rotations included: a key rotated with the prompt and the same key rotated by a decode step are one key.
    (gcc's contraction fused the other product, and a third of the outputs differed by an ulp.)"""
    if native_kernels.library() is None:
        pytest.skip("no native kernels here (POSENC_NATIVE=0 or no compiler)")
    from posenc.nn.mapped_decode import _turns_of_units, rotation_turns
    from posenc.registry import build
    from posenc.scheme import Dims

    for dh, rot in ((64, 64), (48, 32)):
        x, pos, _, cos, sin = case((2, 3, 37, dh), rot, torch.float32, seed=rot)
        x = x * 40.0  # keys of a trained model's size: products far from 1
        for sign in (1.0, -1.0):
            native_out = _fast.rotate_native(x, cos, sin, interleaved, sign)
            assert native_out is not None
            torch.testing.assert_close(native_out, _core._eager(x, cos, sin, interleaved, sign), rtol=0, atol=0)
        scheme = build("rope", Dims(d_model=3 * dh, n_head=3, head_dim=dh, max_seq_len=128),
                       {"rotary_percentage": rot / dh, "rotary_interleaved": interleaved})
        turns = rotation_turns(scheme, pos, torch.float32, dh)[1]
        torch.testing.assert_close(turns(x), scheme.rotate(x, x, pos, pos)[1], rtol=0, atol=0)
        units = _turns_of_units(scheme, pos, torch.float32, dh)[1]  # a scheme without RotationTables
        torch.testing.assert_close(units(x), turns(x), rtol=0, atol=0)
