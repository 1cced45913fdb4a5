"""posenc's RoPE against Hugging Face transformers' own apply_rotary_pos_emb (half-split pairing)
and GPT-NeoX's partial rotary; compared, not copied."""

from __future__ import annotations

import pytest
import torch

from posenc.rotary.rope import RoPE
from posenc.scheme import Dims

llama = pytest.importorskip("transformers.models.llama.modeling_llama")


def hf_cos_sin(pos: torch.Tensor, rot_dim: int, base: float, factor: float = 1.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.int64).float() / rot_dim)) / factor
    freqs = pos[..., None].float() * inv_freq  # (B,T,R/2), HF computes in float32
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


@pytest.mark.parametrize("percentage", [1.0, 0.25])
@pytest.mark.parametrize("base, factor", [(10000.0, 1.0), (500000.0, 1.0), (10000.0, 4.0)])
def test_matches_transformers_apply_rotary_pos_emb(percentage, base, factor):
    head_dim = 64
    rot = int(head_dim * percentage)
    scaling = {"rope_type": "linear", "factor": factor} if factor != 1.0 else None
    rope = RoPE(Dims(256, 4, head_dim, 512), rotary_percentage=percentage, rotary_base=base, rope_scaling=scaling)
    q, k = torch.randn(2, 4, 50, head_dim), torch.randn(2, 4, 50, head_dim)
    pos = torch.randint(0, 2048, (2, 50))
    ours_q, ours_k = rope.rotate(q, k, pos, pos)
    cos, sin = hf_cos_sin(pos, rot, base, factor)
    hf_q, hf_k = llama.apply_rotary_pos_emb(q[..., :rot], k[..., :rot], cos, sin)
    # HF takes float32 angles; ours are float64, so allow float32 angle error at positions ~2k.
    torch.testing.assert_close(ours_q[..., :rot], hf_q, rtol=1e-4, atol=2e-4)
    torch.testing.assert_close(ours_k[..., :rot], hf_k, rtol=1e-4, atol=2e-4)
    assert torch.equal(ours_q[..., rot:], q[..., rot:])  # NeoX partial rotary: the rest passes through
