"""posenc's GPU kernels (posenc/nn/triton) in `make test`: under Triton's interpreter on a machine without a GPU,
compiled at real sizes on a CUDA machine (the row schemes' cases live in triton_cases.py, run in one fresh process;
the other schemes' in test_triton_scheme_kernels.py, a file of its own so that the two interpreted processes run on
two workers side by side); the library without triton installed; and a decode step that builds nothing larger than a row
on the GPU's paths."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import posenc
from posenc.contract.models import perturb_scheme_parameters
from posenc.models import GPT
from posenc.nn import fused_attention
from posenc.nn import triton as gpu
from tests.conftest import tiny_config
from tests.nn.triton_support import run_interpreted

CASES = [Path(__file__).with_name("triton_cases.py")]


@pytest.mark.slow
def test_triton_kernels_under_the_interpreter():
    run_interpreted(*CASES)  # one process: the interpreter's start is paid once


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_triton_kernels_compiled_on_the_gpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    pytest.importorskip("triton")
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                             *map(str, CASES)], cwd=CASES[0].parents[2], env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-8000:]


def test_library_works_without_triton(monkeypatch):
    """Triton is optional: with the package missing nothing routes to it and attention still runs."""
    monkeypatch.setitem(sys.modules, "triton", None)  # as if the package were missing
    monkeypatch.setattr(gpu, "_found", [])
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "triton" else object())
    assert not gpu.installed()
    q = torch.randn(1, 2, 5, 8)
    assert not gpu.serves(q) and not gpu.attention_fits(q, q, q, True)
    scheme = posenc.build("kerple", posenc.Dims(d_model=16, n_head=2, head_dim=8, max_seq_len=16))
    pos = torch.arange(5)[None]
    assert posenc.attention(q, q, q, scheme, pos, pos).shape == q.shape


def test_host_grid_arithmetic_equals_tritons():
    """The launches' grid and tile sizes come from posenc's plain-integer cdiv and next_power_of_2 (Triton's are
    constexpr functions, ~2 us a host call): they give what Triton's give, over every size a launch meets."""
    triton = pytest.importorskip("triton")
    sizes = [*range(0, 1100), 4095, 4096, 4097, 65_535, 131_071, 131_072, 2**31 - 1]
    for n in sizes:
        assert gpu.next_power_of_2(n) == triton.next_power_of_2(n), n
        for d in (1, 3, 16, 64, 128, 256):
            assert gpu.cdiv(n, d) == triton.cdiv(n, d), (n, d)


def test_a_served_check_refuses_any_tensor_off_the_first_ones_device_or_dtypes(monkeypatch):
    """serves() with several tensors (the attention kernels): one on another device, or of a dtype the kernels
    do not take, refuses them all."""
    monkeypatch.setattr(gpu, "_interpret", [True])  # CPU tensors stand for the GPU's, as under the interpreter
    pytest.importorskip("triton")
    q = torch.randn(1, 2, 5, 8)
    assert gpu.serves(q, q.bfloat16(), q.half())
    assert not gpu.serves(q, q.double()) and not gpu.serves(q, q.to(torch.int32))
    assert not gpu.serves(q, torch.randn(1, 2, 5, 8, device="meta"))


class _LargestTensor(TorchDispatchMode):
    """The largest number of elements any operator returns while active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("name", posenc.available())
def test_decode_step_builds_no_more_than_a_row_on_the_gpu_paths(name, monkeypatch):
    """One token against a cache of Tk keys: on the paths a CUDA device takes (no native CPU kernel; the Triton
    kernel or SDPA with a bias row), no tensor larger than a few times the KV cache exists; an (H, Tk, Tk) bias
    would be Tk / Dh = 128 times larger."""
    monkeypatch.setattr(fused_attention, "can_run", lambda *a: False)
    tk, d_model, n_head = 1024, 32, 4
    torch.manual_seed(0)
    model = GPT(tiny_config(name, d_model=d_model, n_head=n_head, n_layer=1, max_seq_len=2 * tk)).eval()
    perturb_scheme_parameters(model)
    tokens = torch.randint(0, 61, (1, tk), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache()
    with torch.no_grad():
        model(tokens[:, :-1], cache=cache)  # the prefill
        with _LargestTensor() as largest:
            model(tokens[:, -1:], cache=cache)  # (1,1) -> one query against tk keys
    cache_elements = n_head * tk * (d_model // n_head)  # (B,Hkv,Tk,Dh) at B = 1
    assert largest.largest <= 4 * cache_elements, f"{name}: a tensor of {largest.largest} elements"
