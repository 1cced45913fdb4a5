"""NeMo fidelity: sandwich, KERPLE and xPos as NeMo's GPT builds them, with expected values worked
out here in numpy from NeMo's formulas (nemo/collections/nlp/modules/common/megatron/
position_embedding/, and language_model.py / attention.py that construct them), through a GPTConfig,
so the dims a model hands its scheme are checked too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc.models import GPT, GPTConfig


def gpt_scheme(name: str, d_model: int = 64, n_head: int = 4, **options):
    cfg = GPTConfig(vocab_size=32, n_layer=1, n_head=n_head, d_model=d_model, max_seq_len=64,
                    position_embedding_type=name, **options)
    return GPT(cfg).scheme(0)


def nemo_slopes(n: int) -> list[float]:
    """NeMo's get_slopes for a power-of-two head count: start = 2^(-2^-(log2(n) - 3)), ratio = start."""
    start = 2 ** (-(2 ** -(np.log2(n) - 3)))
    return [start * start**i for i in range(n)]


@pytest.mark.parametrize("d_model,n_head", [(64, 4), (96, 3), (128, 8)])
def test_sandwich_uses_the_head_dim_as_nemo_gpt_builds_it(d_model, n_head):
    """NeMo: SandwichRelativePositionEmbedding(hidden_size=hidden_size // num_attention_heads);
    bias_h = (sum_{k=1..d/2} cos(|m-n| / 10000^(2k/d)) - d/2) / ((h+1) * 8 / H), h = 0..H-1."""
    d = d_model // n_head
    k = np.arange(1, d / 2 + 1)
    inv_freq = 1.0 / 10000 ** (2 * k / d)
    rel = np.abs(np.arange(20)[:, None] - np.arange(20)[None, :])
    summed = np.cos(rel[:, :, None] * inv_freq).sum(axis=2)  # (T,T)
    expected = np.stack([(summed - d / 2) / ((h + 1) * 8 / n_head) for h in range(n_head)])
    pos = torch.arange(20)[None]
    got = gpt_scheme("sandwich", d_model, n_head).bias(pos, pos)[0].double().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_kerple_at_init_equals_nemo_init():
    """NeMo: b = build_slopes (ALiBi slopes), a = 1, p = 1; bias = -b log(1 + a |m-n|^p)."""
    rel = np.abs(np.arange(16)[:, None] - np.arange(16)[None, :]).astype(np.float64)
    expected = np.stack([-b * np.log(1 + 1.0 * rel**1.0) for b in nemo_slopes(4)])
    pos = torch.arange(16)[None]
    got = gpt_scheme("kerple").bias(pos, pos)[0].detach().double().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_trained_nemo_kerple_is_expressed_exactly():
    """Values a NeMo run could end with, p included: the bias equals NeMo's formula."""
    b = np.array([0.7, 0.2, 0.05, 1.3])
    a = np.array([0.5, 2.0, 1.0, 0.1])
    p = np.array([1.0, 0.6, 1.7, 1.2])
    scheme = gpt_scheme("kerple")
    scheme.load_nemo_parameters({"kerple_b": torch.tensor(b)[:, None, None], "kerple_a": torch.tensor(a),
                                 "kerple_p": torch.tensor(p)})
    rel = np.abs(np.arange(30)[:, None] - np.arange(30)[None, :]).astype(np.float64)
    expected = -b[:, None, None] * np.log(1 + a[:, None, None] * rel[None] ** p[:, None, None])
    pos = torch.arange(30)[None] + 500
    got = scheme.bias(pos, pos)[0].detach().double().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="kerple_p"):
        scheme.load_nemo_parameters({"kerple_b": torch.tensor(b), "kerple_a": torch.tensor(a),
                                     "kerple_p": torch.tensor([1.0, 1.0, 2.5, 1.0])})


def nemo_xpos(x: np.ndarray, scale_base: float, downscale: bool, length: int) -> np.ndarray:
    """NeMo's XPOSPositionEmbedding.forward for one head, x (T, Dh), queries = the last T of `length`."""
    t, dh = x.shape
    scale = (np.arange(0, dh, 2) + 0.4 * dh) / (1.4 * dh)  # (Dh/2,)
    min_pos = -length // 2
    power = np.arange(min_pos, min_pos + length) / scale_base  # centred positions
    s = scale[None, :] ** power[:, None]  # (length, Dh/2)
    inv_freq = 1.0 / 10000 ** (np.arange(0, dh // 2) / (dh // 2))
    angle = np.arange(length)[:, None] * inv_freq[None, :]
    sin, cos = np.sin(angle)[-t:], np.cos(angle)[-t:]
    s = s[-t:]
    if downscale:
        s = 1 / s
    sin, cos = np.repeat(sin * s, 2, axis=1), np.repeat(cos * s, 2, axis=1)  # duplicate_interleave
    rotated = np.stack((-x[:, 1::2], x[:, ::2]), axis=-1).reshape(t, dh)  # rotate_every_two
    return x * cos + rotated * sin


@pytest.mark.parametrize("scale_base", [2048.0, 512.0])
def test_xpos_scores_equal_nemos_with_adjacent_pairs_by_default(scale_base):
    """NeMo rotates adjacent pairs; xpos's default pairing must give NeMo's q.k scores exactly."""
    g = np.random.default_rng(0)
    length, dh = 24, 16
    q, k = g.normal(size=(length, dh)), g.normal(size=(length, dh))
    expected = nemo_xpos(q, scale_base, False, length) @ nemo_xpos(k, scale_base, True, length).T
    scheme = gpt_scheme("xpos", d_model=dh * 2, n_head=2, xpos_scale_base=scale_base)
    pos = torch.arange(length)[None]
    qt = torch.tensor(q, dtype=torch.float32)[None, None]
    kt = torch.tensor(k, dtype=torch.float32)[None, None]
    qr, kr = scheme.rotate(qt, kt, pos, pos)
    got = (qr[0, 0].double() @ kr[0, 0].double().T).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    half = gpt_scheme("xpos", d_model=dh * 2, n_head=2, xpos_scale_base=scale_base, rotary_interleaved=False)
    qh, kh = half.rotate(qt, kt, pos, pos)
    assert not np.allclose((qh[0, 0].double() @ kh[0, 0].double().T).numpy(), expected, atol=1e-2)
