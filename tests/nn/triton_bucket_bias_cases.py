"""The Triton path for rows read from a table by a fixed bucket per distance (Scheme.bucket_bias: T5's `relative`,
posenc/nn/triton/bucket_bias.py) equals the float64 reference: attention with T5's own dense bias, outputs and the
gradients of q, k, v and of the bucket table, which dQ's kernel sums per bucket and tile (one running sum for tiles
of one bucket, diagonal sums for tiles that span several). T5 with 8 buckets and max_distance 12 here, so that at
the interpreter's 16 x 16 tiles far tiles (one bucket) and near ones (several) both occur at a few dozen positions.

Not collected by `make test` directly: tests/nn/test_triton_scheme_kernels.py runs this file with the others in one
fresh process (TRITON_INTERPRET=1 without a GPU: tiny shapes; compiled on a CUDA machine at real ones).
"""

from __future__ import annotations

import copy

import pytest
import torch

from posenc.bias.t5 import T5RelativeBias
from posenc.nn import dispatch, row_paths
from posenc.nn import triton as gpu
from posenc.nn.call import Call
from posenc.scheme import Dims
from tests.nn.triton_support import (
    at_kernel_precision,
    attention_reference,
    exact_float32,
    kernel_device,
    twins,
    within_reach,
)

pytestmark = pytest.mark.skipif(not gpu.installed(), reason="triton is not installed")
INTERPRETED, DEVICE = kernel_device()

from posenc.nn.triton import attention, bucket_bias  # noqa: E402  (after the interpreter's setting)

SCALE = 1 if INTERPRETED else 16  # sequence lengths: tiny under the interpreter, real on a GPU
if not INTERPRETED:
    torch.set_float32_matmul_precision("high")  # float32 runs as TF32 on a GPU (attention.serves_float32)
TOLERANCE = {torch.float32: 2e-5 if exact_float32() else 5e-3, torch.bfloat16: 3e-2}
TABLE_TOLERANCE_BF16 = 6e-2  # a bucket's gradient sums dS over many pairs (triton_head_bias_cases.py's floor)
LAYOUTS = {"causal_gqa": (2, 2, 1, 16, 40, 40, True), "after_cache": (1, 2, 2, 16, 21, 45, True),
           "encoder": (1, 2, 1, 32, 36, 36, False)}  # (B, H, Hkv, Dh, Tq, Tk, causal)


def t5(causal: bool, heads: int = 2) -> T5RelativeBias:
    scheme = T5RelativeBias(Dims(d_model=16 * heads, n_head=heads, head_dim=16, max_seq_len=1024, causal=causal),
                            relative_attention_num_buckets=8, relative_attention_max_distance=12)
    with torch.no_grad():
        scheme.table.copy_(torch.randn(scheme.table.shape, generator=torch.Generator().manual_seed(1)))
    return scheme.to(DEVICE)


def inputs(layout: str, dtype: torch.dtype, seed: int = 0):
    b, h, hkv, dim, tq, tk, causal = LAYOUTS[layout]
    tq, tk = tq * SCALE, tk * SCALE
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, tq, dim, generator=g)
    k, v = (torch.randn(b, hkv, tk, dim, generator=g) for _ in range(2))
    k_pos = (torch.arange(tk) + 3 + 2 * torch.arange(b)[:, None]).to(DEVICE)  # batch rows at other offsets
    q_pos = k_pos[:, tk - tq:]
    qkv = [t.to(DEVICE, dtype).requires_grad_() for t in (q, k, v)]
    return qkv, q_pos, k_pos, causal, torch.randn(b, h, tq, dim, generator=g).to(DEVICE)


def check(scheme, fast, qkv, q_pos, k_pos, causal, grad, dtype, what):
    """fast and its gradients (q, k, v, the table) against T5's dense bias in float64, within reach of the same
    formula at the kernel's precision."""
    exact_scheme, exact_leaves = copy.deepcopy(scheme).double(), twins(qkv)
    exact = attention_reference(*exact_leaves, exact_scheme.bias(q_pos, k_pos), causal)
    with at_kernel_precision():
        low = attention_reference(*qkv, scheme.bias(q_pos, k_pos), causal)
    within_reach(fast, exact, low, TOLERANCE[dtype], f"{what} output")
    with at_kernel_precision():
        rough = torch.autograd.grad(low, [*qkv, scheme.table], grad.to(low.dtype))
    for name, a, b, c in zip(("dq", "dk", "dv", "dtable"),
                             torch.autograd.grad(fast, [*qkv, scheme.table], grad.to(fast.dtype)),
                             torch.autograd.grad(exact, [*exact_leaves, exact_scheme.table], grad.double()), rough,
                             strict=True):
        wide = name == "dtable" and dtype == torch.bfloat16
        within_reach(a, b, c, TABLE_TOLERANCE_BF16 if wide else TOLERANCE[dtype], f"{what} {name}")


def test_the_windows_marks_name_their_one_bucket_or_minus_one():
    """padded_buckets against a direct reading: at o the one bucket of elements o .. o + window - 1 (the ends
    repeated into the padding), or -1; a T5 row holds both kinds (far windows in the last bucket)."""
    buckets = t5(True).bucket_bias(torch.arange(-5, 40, device=DEVICE)).buckets.flip(-1)
    padded, marks = bucket_bias.padded_buckets(buckets, 8, 7)
    whole = torch.cat((buckets[:1].expand(8), buckets, buckets[-1:].expand(8 + 6))).tolist()
    start = padded.storage_offset()  # the views start at the real data: read the padding below through the base
    assert start == marks.storage_offset() == 8
    base_padded, base_marks = padded.as_strided((start + padded.numel(),), (1,), 0), marks.as_strided(
        (start + marks.numel(),), (1,), 0)
    for o in range(-8, buckets.numel() + 8):
        window = set(whole[o + 8 : o + 15])
        assert base_marks[o + 8].item() == (window.pop() if len(window) == 1 else -1), o
        assert base_padded[o + 8].item() == whole[o + 8], o
    assert (marks[: buckets.numel()] == -1).any() and (marks[: buckets.numel()] == 7).any()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_bucket_kernel_gives_t5s_float64_gradients(layout, monkeypatch):
    """row_paths.triton_bucket_bias (in float32 here: the dispatch sends 16-bit types to it) against T5's dense bias
    in float64: GQA with far tiles, queries after a cache, and a bidirectional encoder (buckets not monotone)."""
    causal = LAYOUTS[layout][-1]
    scheme = t5(causal)
    qkv, q_pos, k_pos, causal, grad = inputs(layout, torch.float32)
    calls = []
    kernel = bucket_bias.attend_bucket_bias
    monkeypatch.setattr(bucket_bias, "attend_bucket_bias", lambda *a: calls.append(1) or kernel(*a))
    fast = row_paths.triton_bucket_bias(Call(*qkv, scheme, q_pos, k_pos, causal, 0.0, True))
    assert calls, "the bucket kernel must serve T5's training call"
    check(scheme, fast, qkv, q_pos, k_pos, causal, grad, torch.float32, layout)


def test_the_dispatch_trains_t5_in_bf16_through_the_bucket_kernel(monkeypatch):
    """bf16 with a gradient: the plan's triton_bucket_bias serves (not triton_rows); float32 keeps triton_rows."""
    scheme = t5(True)
    used = []
    for module, name in ((bucket_bias, "attend_bucket_bias"), (attention, "attend_rows")):
        kernel = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, kernel=kernel, name=name: used.append(name) or kernel(*a))
    qkv, q_pos, k_pos, causal, grad = inputs("causal_gqa", torch.bfloat16, seed=4)
    fast = dispatch.fast_attention(*qkv, scheme, q_pos, k_pos, causal)
    assert used == ["attend_bucket_bias"]
    check(scheme, fast, qkv, q_pos, k_pos, causal, grad, torch.bfloat16, "bf16")
    qkv32, *_ = inputs("causal_gqa", torch.float32, seed=4)
    dispatch.fast_attention(*qkv32, scheme, q_pos, k_pos, causal)
    assert used == ["attend_bucket_bias", "attend_rows"]


@pytest.mark.parametrize("causal", [True, False])
def test_the_gpu_tiles_sum_every_bucket(causal, monkeypatch):
    """At the GPU's tiles (dq_buckets' 128 x 64 at Dh 64: the diagonal sums in three chunks of 64) with T5's own 32
    buckets and max_distance 128, over enough keys that query blocks see tiles of the last bucket too."""
    monkeypatch.setattr(attention, "tiles", lambda kernel, head_dim, device, dtype: attention.gpu_tiles(
        kernel, head_dim, torch.bfloat16 if DEVICE == "cpu" else dtype))
    scheme = T5RelativeBias(Dims(d_model=128, n_head=2, head_dim=64, max_seq_len=1024, causal=causal)).to(DEVICE)
    t = 330 * (1 if INTERPRETED else 4)
    g = torch.Generator().manual_seed(7)
    qkv = [torch.randn(1, h, t, 64, generator=g).to(DEVICE).requires_grad_() for h in (2, 1, 1)]
    pos = torch.arange(t, device=DEVICE)[None]
    fast = row_paths.triton_bucket_bias(Call(*qkv, scheme, pos, pos, causal, 0.0, True))
    check(scheme, fast, qkv, pos, pos, causal, torch.randn(fast.shape, generator=g).to(DEVICE), torch.float32,
          f"gpu tiles causal={causal}")


def test_a_table_of_the_wrong_shape_is_refused_in_one_line():
    q = k = v = torch.zeros(1, 2, 3, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"table \(3, 8\): expected \(H,NB\) with H=2"):
        bucket_bias.attend_bucket_bias(q, k, v, torch.zeros(3, 8), torch.zeros(9, dtype=torch.int64),
                                       torch.tensor([3]), True)
