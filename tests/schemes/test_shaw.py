"""Shaw et al. 2018: the gather/scatter path equals the paper's (T,T,Dh) formula, without its memory."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from posenc.content.shaw import Shaw
from posenc.models import GPT, GPTConfig
from posenc.nn.attention import SelfAttention
from posenc.scheme import Dims


def naive_shaw_attention(q, k, v, q_pos, k_pos, scheme: Shaw, causal: bool):
    """Eq. 3-5 literally: build a^K, a^V as (B,Tq,Tk,Dh) tensors, one vector per (query, key) pair."""
    clip = scheme.max_relative_position
    distance = (k_pos[:, None, :] - q_pos[:, :, None]).clamp(-clip, clip) + clip  # (B,Tq,Tk)
    a_k, a_v = scheme.key_table[distance], scheme.value_table[distance]  # (B,Tq,Tk,Dh)
    scores = torch.einsum("bhmd,bhnd->bhmn", q, k) + torch.einsum("bhmd,bmnd->bhmn", q, a_k)
    scores = scores / q.shape[-1] ** 0.5
    if causal:
        scores = scores.masked_fill(k_pos[:, None, None, :] > q_pos[:, None, :, None], float("-inf"))
    weights = scores.softmax(-1)
    return weights @ v + torch.einsum("bhmn,bmnd->bhmd", weights, a_v)


def random_shaw(head_dim: int = 8, clip: int = 3, seed: int = 0) -> Shaw:
    torch.manual_seed(seed)
    dims = Dims(d_model=4 * head_dim, n_head=4, head_dim=head_dim, max_seq_len=64)
    scheme = Shaw(dims, shaw_max_relative_position=clip)
    with torch.no_grad():  # unit-scale tables so the positional terms dominate any rounding
        scheme.key_table.normal_()
        scheme.value_table.normal_()
    return scheme


@pytest.mark.parametrize("causal", [True, False])
def test_efficient_path_equals_naive_formula(causal):
    scheme = random_shaw()
    attention = SelfAttention(d_model=32, n_head=4, n_kv_head=4, causal=causal)
    x = torch.randn(2, 13, 32)
    pos = torch.arange(13).expand(2, 13) + 4  # offsets beyond the clip distance on both sides
    out = attention(x, scheme, pos, pos)
    q, k, v = (attention._heads(proj(x), 4) for proj in (attention.q_proj, attention.k_proj, attention.v_proj))
    naive = naive_shaw_attention(q, k, v, pos, pos, scheme, causal)
    expected = attention.o_proj(naive.transpose(1, 2).flatten(2))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_distances_beyond_k_share_the_clipped_vector():
    scheme = random_shaw(clip=2)
    q = torch.randn(1, 4, 1, 8)
    bias = scheme.bias(torch.tensor([[10]]), torch.arange(20)[None], q)  # (1,H,1,20)
    assert torch.equal(bias[..., 0], bias[..., 8])  # n - m = -10 and -2 both clip to -2
    assert torch.equal(bias[..., 12], bias[..., 19])  # +2 and +9 clip to +2
    assert not torch.equal(bias[..., 8], bias[..., 9])  # -2 and -1 differ


def test_value_term_conserves_weight_mass():
    """Scattering weights into distance buckets keeps each row's sum, so the value term is a convex mix."""
    scheme = random_shaw()
    weights = torch.rand(2, 4, 6, 9).softmax(-1)
    pos_q, pos_k = torch.arange(3, 9).expand(2, 6), torch.arange(9).expand(2, 9)
    with torch.no_grad():
        scheme.value_table.copy_(torch.ones_like(scheme.value_table))
    torch.testing.assert_close(scheme.mix_values(weights, pos_q, pos_k), torch.ones(2, 4, 6, 8))


class ShapeRecorder(TorchDispatchMode):
    """Records the shape of every tensor an op returns (the memory a forward allocates)."""

    def __init__(self) -> None:
        super().__init__()
        self.numels: list[tuple[int, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.numels.append((t.numel(), f"{func}: {tuple(t.shape)}"))
        return out


def test_no_tensor_grows_as_t_times_t_times_head_dim():
    """At T=96, Dh=32 a (T,T,Dh) tensor has 294,912 elements; the efficient forward never makes one,
    while the naive formula does (so the recorder would catch a regression)."""
    t, head_dim = 96, 32
    cfg = GPTConfig(position_embedding_type="shaw", vocab_size=50, n_layer=1, n_head=4, d_model=4 * head_dim,
                    max_seq_len=t, shaw_max_relative_position=8)
    model = GPT(cfg).eval()
    ids = torch.randint(0, 50, (1, t))
    with torch.no_grad(), ShapeRecorder() as recorder:
        model(ids)
    largest, where = max(recorder.numels)
    assert largest < t * t * head_dim, where

    scheme, pos, q = model.schemes[0], torch.arange(t)[None], torch.randn(1, 4, t, head_dim)
    with torch.no_grad(), ShapeRecorder() as naive:
        naive_shaw_attention(q, q, q, pos, pos, scheme, causal=True)
    assert max(naive.numels)[0] >= t * t * head_dim
