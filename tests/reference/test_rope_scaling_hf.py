"""RoPE scalings against transformers' own rope initialisation functions (an independent
implementation), for every rope_type over several configs; and NeMo's
seq_len_interpolation_factor against linear scaling."""

from __future__ import annotations

import pytest
import torch

from posenc.models import GPT, GPTConfig
from posenc.rotary._core import angles, cos_sin
from posenc.rotary.rope import RoPE
from posenc.rotary.scaling import ROPE_SCALINGS, SEQ_LEN_DEPENDENT, frequencies
from posenc.scheme import Dims

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

N_HEAD = 4


def hf_frequencies(rope: dict, head_dim: int, base: float, max_pos: int, seq_len: int | None = None):
    """transformers' (inv_freq, attention_scaling) for a Llama config with this rope_parameters."""
    params = {**{k: (list(v) if isinstance(v, list) else v) for k, v in rope.items()}, "rope_theta": base}
    cfg = LlamaConfig(hidden_size=head_dim * N_HEAD, num_attention_heads=N_HEAD, max_position_embeddings=max_pos,
                      rope_parameters=params)
    default = LlamaRotaryEmbedding.compute_default_rope_parameters  # "default" has no ROPE_INIT_FUNCTIONS entry
    init = ROPE_INIT_FUNCTIONS.get(cfg.rope_parameters["rope_type"], default)
    inv_freq, attention = init(cfg, device=None, seq_len=seq_len)
    return inv_freq, float(attention)


def assert_same(ours, theirs):
    torch.testing.assert_close(ours[0], theirs[0].to(torch.float32), rtol=2e-6, atol=0)
    assert ours[1] == pytest.approx(theirs[1], rel=1e-12)


def rng_factors(n: int, seed: int, low: float, high: float) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    return (low + (high - low) * torch.rand(n, generator=g, dtype=torch.float64)).tolist()


# (rope_scaling, head_dim, base, max_position_embeddings, [seq_len...])
CASES = [
    ({"rope_type": "default"}, 64, 10000.0, 2048, [None]),
    ({"rope_type": "default"}, 128, 500000.0, 8192, [None]),
    ({"rope_type": "linear", "factor": 2.0}, 64, 10000.0, 2048, [None]),
    ({"rope_type": "linear", "factor": 8}, 128, 100000.0, 8192, [None]),
    ({"type": "linear", "factor": 4.0}, 64, 10000.0, 2048, [None]),  # HF's legacy key name
    ({"rope_type": "dynamic", "factor": 2.0}, 64, 10000.0, 2048, [None, 100, 2048, 3000, 8192]),
    ({"rope_type": "dynamic", "factor": 4.0}, 128, 100000.0, 8192, [None, 8193, 32768, 100_000]),
    ({"rope_type": "yarn", "factor": 4.0}, 64, 10000.0, 2048, [None]),
    ({"rope_type": "yarn", "factor": 2.0}, 64, 100000.0, 8192, [None]),
    ({"rope_type": "yarn", "factor": 8.0, "beta_fast": 16, "beta_slow": 2, "truncate": False}, 128, 10000.0, 4096,
     [None]),
    ({"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096}, 64, 1e6, 65536, [None]),
    ({"rope_type": "yarn", "factor": 40.0, "mscale": 0.707, "mscale_all_dim": 1.0,
      "original_max_position_embeddings": 4096}, 64, 10000.0, 163840, [None]),  # DeepSeek-V3 style
    ({"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.25}, 64, 10000.0, 2048, [None]),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, 128, 500000.0, 131072, [None]),  # Llama 3.1
    ({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, 64, 500000.0, 131072, [None]),  # Llama 3.2
    ({"rope_type": "longrope", "short_factor": rng_factors(32, 0, 1.0, 1.5),
      "long_factor": rng_factors(32, 1, 1.0, 40.0), "original_max_position_embeddings": 4096},
     64, 10000.0, 131072, [None, 4096, 4097, 100_000]),  # Phi-3 style: factor from the two lengths
    ({"rope_type": "longrope", "short_factor": rng_factors(48, 2, 1.0, 1.2), "long_factor": rng_factors(48, 3, 1, 8),
      "original_max_position_embeddings": 8192, "factor": 4.0, "attention_factor": 1.1}, 96, 10000.0, 32768,
     [None, 9000]),
]


@pytest.mark.parametrize(("rope", "head_dim", "base", "max_pos", "seq_lens"), CASES,
                         ids=[f"{c[0].get('rope_type', c[0].get('type'))}-{i}" for i, c in enumerate(CASES)])
def test_matches_transformers(rope, head_dim, base, max_pos, seq_lens):
    for seq_len in seq_lens:
        ours = frequencies(head_dim, base, rope, max_pos, seq_len)
        assert_same(ours, hf_frequencies(rope, head_dim, base, max_pos, seq_len))


def test_every_registered_type_is_covered():
    covered = {c[0].get("rope_type", c[0].get("type")) for c in CASES}
    assert covered | {"ntk"} == set(ROPE_SCALINGS)


@pytest.mark.parametrize(("factor", "head_dim", "base", "max_pos"), [(2.0, 64, 10000.0, 4096), (4.0, 128, 1e5, 4096)])
def test_static_ntk_is_dynamic_ntk_at_its_fixed_point(factor, head_dim, base, max_pos):
    """HF has no static NTK type; its dynamic NTK at L = L_train (2f - 1) / f raises the base by
    exactly f^(R/(R-2)), which is what `ntk` does at every length."""
    seq_len = int(max_pos * (2 * factor - 1) / factor)
    ours = frequencies(head_dim, base, {"rope_type": "ntk", "factor": factor}, max_pos)
    assert_same(ours, hf_frequencies({"rope_type": "dynamic", "factor": factor}, head_dim, base, max_pos, seq_len))
    assert_same(ours, frequencies(head_dim, base, {"rope_type": "ntk", "factor": factor}, max_pos, 10**6))


def test_dynamic_equals_default_within_the_trained_length():
    default = frequencies(64, 10000.0, None, 2048)
    for seq_len in (None, 1, 2048):
        assert_same(frequencies(64, 10000.0, {"rope_type": "dynamic", "factor": 4.0}, 2048, seq_len), default)
    assert "dynamic" in SEQ_LEN_DEPENDENT and "longrope" in SEQ_LEN_DEPENDENT


def test_scalings_leave_the_highest_frequency_and_slow_the_lowest():
    """A property every extension method shares: theta_0 = 1 (local order) is kept, except linear,
    and the lowest frequency never speeds up."""
    default, _ = frequencies(64, 10000.0)
    for rope in ({"rope_type": "ntk", "factor": 4.0}, {"rope_type": "yarn", "factor": 4.0},
                 {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}):
        inv_freq, _ = frequencies(64, 10000.0, rope, 2048)
        assert inv_freq[0] == pytest.approx(1.0) and inv_freq[-1] < default[-1]


BAD = [
    ({"rope_type": "linear", "factor": 0.5}, "rope_scaling.factor"),
    ({"rope_type": "linear"}, "rope_scaling.factor"),
    ({"rope_type": "linear", "factor": True}, "rope_scaling.factor"),
    ({"rope_type": "yarn", "factor": 4.0, "beta_fast": 1.0, "beta_slow": 2.0}, "rope_scaling.beta_fast"),
    ({"rope_type": "yarn", "factor": 4.0, "beta_slow": -1}, "rope_scaling.beta_slow"),
    ({"rope_type": "yarn", "factor": 4.0, "truncate": "yes"}, "rope_scaling.truncate"),
    ({"rope_type": "yarn", "factor": 4.0, "mscale": 1.0}, "rope_scaling.mscale"),
    ({"rope_type": "yarn", "factor": 4.0, "attention_factor": 0}, "rope_scaling.attention_factor"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0},
     "rope_scaling.original_max_position_embeddings"),
    ({"rope_type": "yarn", "factor": 4.0, "beta_fats": 32}, "rope_scaling.beta_fats"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0},
     "rope_scaling.high_freq_factor"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 32}, "rope_scaling.short_factor"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [0.0] * 32}, "rope_scaling.long_factor"),
    ({"rope_type": "longrope", "long_factor": [1.0] * 32}, "rope_scaling.short_factor"),  # missing: not a TypeError
    ({"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": 2.0}, "rope_scaling.long_factor"),
    ({"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}, "rope_scaling.rope_theta"),
    ({"rope_type": "yarnn", "factor": 2.0}, "did you mean 'yarn'"),
]


@pytest.mark.parametrize(("rope", "named"), BAD, ids=[b[1] for b in BAD])
def test_bad_values_are_value_errors_naming_the_field(rope, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        frequencies(64, 10000.0, rope, 2048)


def test_dynamic_needs_the_trained_length():
    with pytest.raises(ValueError, match="max_position_embeddings"):
        frequencies(64, 10000.0, {"rope_type": "dynamic", "factor": 2.0}, None, 4096)


# NeMo's RotaryEmbedding: seq = arange(T) / seq_len_interpolation_factor; freqs = outer(seq, inv_freq).
@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
def test_nemo_interpolation_factor_is_linear_scaling(factor):
    dims = Dims(d_model=64, n_head=2, head_dim=32, max_seq_len=256)
    nemo = RoPE(dims, rope_scaling={"rope_type": "linear", "factor": factor})
    pos = torch.arange(0, 5000, 7)[None]
    inv_freq, _ = frequencies(32, 10000.0)
    nemo_angles = (pos.to(torch.float64) / factor)[..., None] * inv_freq.to(torch.float64)  # (1,T,R/2)
    torch.testing.assert_close(angles(pos, nemo.inv_freq), nemo_angles, rtol=1e-6, atol=1e-6)
    cos, sin = cos_sin(pos, nemo.inv_freq)
    torch.testing.assert_close(cos[:, 0], nemo_angles.cos().float(), rtol=0, atol=2e-6)
    torch.testing.assert_close(sin[:, 0], nemo_angles.sin().float(), rtol=0, atol=2e-6)


def test_gpt_seq_len_interpolation_factor_equals_rope_scaling_linear():
    common = dict(vocab_size=50, n_layer=2, n_head=2, d_model=32, max_seq_len=64, position_embedding_type="rope")
    ids = torch.randint(0, 50, (2, 40), generator=torch.Generator().manual_seed(0))
    logits = []
    for extra in ({"seq_len_interpolation_factor": 4.0}, {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}):
        torch.manual_seed(0)
        logits.append(GPT(GPTConfig(**common, **extra)).eval()(ids))
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=0)
