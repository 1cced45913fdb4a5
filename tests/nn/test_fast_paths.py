"""Every fast path equals its reference path, for every scheme in the registry that uses it."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.contract.models import perturb_scheme_parameters
from posenc.nn import bias_paths, dispatch, fused_attention
from posenc.nn.attention_core import attend
from posenc.registry import SCHEMES
from posenc.rotary import _fast
from posenc.rotary._core import apply_rotary_reference, cos_sin, inv_frequencies
from posenc.scheme import Dims, Scheme, materialises_bias

BIASED = [n for n in posenc.available() if materialises_bias(SCHEMES[n]) and not SCHEMES[n].needs_weights]


def build(name: str, causal: bool = True):
    from posenc.models import GPTConfig

    cfg = GPTConfig(vocab_size=32, n_layer=1, n_head=4, d_model=64, max_seq_len=512, position_embedding_type=name)
    dims = Dims(64, 4, 16, 512, causal, 4)
    torch.manual_seed(0)
    scheme = SCHEMES[name](dims, cfg.options)
    perturb_scheme_parameters(scheme)
    return scheme


def qkv(tq: int, tk: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 4, tq, 16, generator=g), torch.randn(2, 4, tk, 16, generator=g),
            torch.randn(2, 4, tk, 16, generator=g))


def reference(q, k, v, scheme, q_pos, k_pos, causal):
    return attend(q, k, v, scheme.bias(q_pos, k_pos, q, k), causal)


@pytest.mark.parametrize("name", BIASED)
@pytest.mark.parametrize("tq, tk", [(300, 300), (70, 333)])  # full, and queries after a cache
def test_chunked_equals_reference(name, tq, tk):
    scheme = build(name)
    q, k, v = qkv(tq, tk)
    k_pos = torch.arange(tk).expand(2, tk) + 11
    q_pos = k_pos[:, tk - tq :]
    with torch.no_grad():
        fast = bias_paths.chunked_attention(q, k, v, scheme, q_pos, k_pos, True, rows=64)
        torch.testing.assert_close(fast, reference(q, k, v, scheme, q_pos, k_pos, True), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", BIASED)
def test_chunked_gradients_equal_reference_gradients(name):
    scheme = build(name)
    q, k, v = (t.requires_grad_() for t in qkv(130, 130))
    pos = torch.arange(130).expand(2, 130)
    grads = []
    for fn in (lambda: bias_paths.chunked_attention(q, k, v, scheme, pos, pos, True, rows=32),
               lambda: reference(q, k, v, scheme, pos, pos, True)):
        out = fn()
        grads.append(torch.autograd.grad(out.square().sum(), [q, k, v, *scheme.parameters()]))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


SCORE_MODS = [n for n in BIASED if SCHEMES[n].score_mod is not Scheme.score_mod and SCHEMES[n].supports_causal]


def test_schemes_without_a_score_mod_say_so():
    """A bias that reads q or k (or an MLP) has no score_mod: the hook must return None, not a wrong function."""
    pos = torch.arange(8)[None]
    for name in set(BIASED) - set(SCORE_MODS):
        assert build(name).score_mod(pos, pos) is None, name


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor needs a C++ compiler on CPU")
@pytest.mark.skipif("mutants" in Path(posenc.__file__).parts,
                    reason="under mutmut a score_mod is a trampoline (*args), which flex_attention cannot trace")
@pytest.mark.parametrize("name", SCORE_MODS)
def test_flex_score_mod_equals_reference(name):
    """The compiled flex_attention path (CUDA's default, opt-in on CPU) against the full-bias reference."""
    scheme = build(name)
    q, k, v = qkv(260, 260, seed=1)
    k_pos = torch.arange(260).expand(2, 260) + 3
    q_pos = k_pos
    with torch.no_grad():
        expected = reference(q, k, v, scheme, q_pos, k_pos, True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fast = bias_paths.flex_attention_path(q, k, v, scheme, q_pos, k_pos, True)
        assert fast is not None, f"flex_attention did not run: {[str(w.message) for w in caught]}"
        torch.testing.assert_close(fast, expected, rtol=1e-4, atol=1e-4)


def test_flex_is_opt_in_on_cpu_and_default_on_cuda(monkeypatch):
    monkeypatch.delenv("POSENC_FLEX", raising=False)
    assert not bias_paths.flex_enabled(torch.device("cpu")) and bias_paths.flex_enabled(torch.device("cuda"))
    monkeypatch.setenv("POSENC_FLEX", "1")
    assert bias_paths.flex_enabled(torch.device("cpu"))


def test_dispatch_uses_flex_or_chunks_for_long_inputs_and_never_builds_the_full_bias(monkeypatch):
    scheme = build("alibi")
    q, k, v = qkv(1100, 1100)
    pos = torch.arange(1100).expand(2, 1100)
    shapes = []
    real_bias = type(scheme).bias
    def recording_bias(self, *args, **kwargs):
        shapes.append(args[0].shape)
        return real_bias(self, *args, **kwargs)

    monkeypatch.setattr(type(scheme), "bias", recording_bias)
    monkeypatch.setattr(fused_attention, "can_run", lambda *args: False)  # no rows: the chunked path
    monkeypatch.setitem(bias_paths._flex_state, "failed", True)
    with torch.no_grad():
        dispatch.attention(q, k, v, scheme, pos, pos, True)
    assert shapes and max(s[1] for s in shapes) <= bias_paths.CHUNK_ROWS


@pytest.mark.parametrize("percentage", [1.0, 0.5])
def test_complex_rope_kernel_equals_reference(percentage):
    rot = int(32 * percentage)
    inv_freq = inv_frequencies(rot, 10000.0)
    x = torch.randn(2, 5, 3, 32).transpose(1, 2)  # strided like a projected q
    pos = torch.randint(0, 100_000, (2, 5))
    cos, sin = cos_sin(pos, inv_freq)
    assert _fast.can_use_complex(x)
    out = _fast.rotate_interleaved_complex(x, cos, sin)
    torch.testing.assert_close(out.double(), apply_rotary_reference(x, pos, inv_freq, True), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif("mutants" in Path(posenc.__file__).parts,
                    reason="under mutmut's coverage tracing and trampolines, dynamo cannot compile")
def test_compiled_half_split_rope_kernel_equals_reference():
    inv_freq = inv_frequencies(24, 10000.0)
    x = torch.randn(1, 4, 64, 32)
    pos = torch.randint(0, 100_000, (1, 64))
    cos, sin = cos_sin(pos, inv_freq)
    out = _fast.rotate_half_split_compiled(x, cos, sin)
    assert out is not None, "torch.compile failed on this machine"
    torch.testing.assert_close(out.double(), apply_rotary_reference(x, pos, inv_freq, False), rtol=1e-5, atol=1e-5)


def test_the_flex_head_dim_limit_is_tritons_only():
    """Inductor's CPU template takes any head dim; its Triton one (CUDA; meta stands in here) needs 16."""
    assert bias_paths.flex_fits(torch.empty(1, 1, 4, 8), torch.empty(1, 1, 4, 8))
    small, ok = torch.empty(1, 1, 4, 8, device="meta"), torch.empty(1, 1, 4, 16, device="meta")
    assert not bias_paths.flex_fits(small, small) and not bias_paths.flex_fits(ok, small)
    assert bias_paths.flex_fits(ok, ok)


@pytest.mark.parametrize("rows", [1, 4])
@torch.no_grad()
def test_decoding_rows_under_cpu_autocast_run_sdpa_in_float32(rows):
    """A few query rows (decoding) under bfloat16 autocast on the CPU: the float32 kernel (6x faster there than the
    bfloat16 one, and more exact), returned in bfloat16 as SDPA under autocast returns; GQA kept."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 9, rows, 64, generator=g)
    k, v = torch.randn(1, 3, 512, 64, generator=g), torch.randn(1, 3, 512, 64, generator=g)
    exact = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast = attend(q, k, v, None, causal=rows == 1)
        lower = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert fast.dtype == lower.dtype == torch.bfloat16
    assert torch.equal(fast, exact.to(torch.bfloat16))  # float32 scores, one rounding at the end
    assert not torch.equal(lower, exact.to(torch.bfloat16))  # what it replaces: bfloat16 inside, not the same


@torch.no_grad()
def test_cached_decoding_under_autocast_equals_recomputation_within_bfloat16():
    """The decoding path (float32 SDPA for the new row) against a full recomputation of the same prefix."""
    from posenc.models import Llama, LlamaConfig

    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=61, n_layer=2, n_head=4, n_kv_head=2, d_model=32, ffn_hidden_size=64,
                              max_seq_len=64)).eval()
    ids = torch.randint(0, 61, (1, 40))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cache = model.new_cache()
        model(ids[:, :39], cache=cache)
        step = model(ids[:, 39:], cache=cache)[:, -1].float()
        full = model(ids)[:, -1].float()
    assert (step - full).abs().max().item() < 0.05 * full.abs().max().item()

