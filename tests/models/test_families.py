"""Every family of the decoder against transformers' own class (an independent implementation): a tiny random
checkpoint built and saved by transformers loads in posenc with the same logits in float64, without the cache
and token by token through it, under the checkpoint's own rope_scaling kinds; posenc saves it back to a folder
transformers reads to the same logits. The tolerance is float32's: transformers computes its norms and rotary
tables in float32 whatever the model's dtype."""

from __future__ import annotations

import pytest
import torch

from posenc.models import Llama
from posenc.models.families import FAMILIES as TABLE
from posenc.models.hf_llama import save_hf
from tests.models.family_checkpoints import FAMILIES, VOCAB, build, load_hf

pytest.importorskip("transformers")
PROMPT = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
PREFILL = 15  # then token by token through the cache
TOLERANCE = 1e-5


def assert_close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    scale = max(1.0, theirs.abs().max().item())
    assert (ours - theirs).abs().max().item() <= TOLERANCE * scale


def hf_cached_logits(hf, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = hf(ids[:, :PREFILL], use_cache=True)
        logits, cache = [out.logits], out.past_key_values
        for t in range(PREFILL, ids.shape[1]):
            out = hf(ids[:, t : t + 1], cache=cache, use_cache=True)
            logits.append(out.logits)
            cache = out.past_key_values
    return torch.cat(logits, dim=1)


def our_cached_logits(model: Llama, ids: torch.Tensor) -> torch.Tensor:
    cache = model.new_cache()
    with torch.no_grad():
        logits = [model(ids[:, :PREFILL], cache=cache)]
        logits += [model(ids[:, t : t + 1], cache=cache) for t in range(PREFILL, ids.shape[1])]
    return torch.cat(logits, dim=1)


def compare(directory) -> tuple[Llama, object]:
    """Load both sides, assert equal logits without and with the cache; return them."""
    hf, ours = load_hf(directory), Llama.from_hf(directory).double()
    with torch.no_grad():
        assert_close(ours(PROMPT), hf(PROMPT).logits)
    assert_close(our_cached_logits(ours, PROMPT), hf_cached_logits(hf, PROMPT))
    return ours, hf


def test_every_family_of_the_table_is_tested():
    assert set(FAMILIES) == set(TABLE)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_equal_transformers(tmp_path, family):
    ours, _ = compare(build(family, tmp_path))
    assert ours.cfg.family == family


# The rope_scaling kinds the families' released checkpoints carry (Llama 3.1/3.2: llama3; Qwen2.5/Qwen3 long
# context: yarn; Phi-3 128k: longrope with partial rotation in Phi-3.5/4-mini; Gemma 3: linear on its global
# layers only), and dynamic NTK; the prompt (24) runs past the original context (16) so every kind acts.
ORIGINAL = 16
SCALINGS = {
    "llama-llama3": ("llama", {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": ORIGINAL}),
    "llama-dynamic": ("llama", {"rope_type": "dynamic", "factor": 2.0}),
    "qwen2-yarn": ("qwen2", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL}),
    "qwen3-yarn": ("qwen3", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL}),
    "mistral-linear": ("mistral", {"rope_type": "linear", "factor": 2.0}),
    "gemma3-linear": ("gemma3", {"rope_type": "linear", "factor": 8.0}),
    "olmo2-yarn": ("olmo2", {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": ORIGINAL}),
}


@pytest.mark.parametrize("case", sorted(SCALINGS))
def test_checkpoint_scalings_equal_transformers(tmp_path, case):
    family, scaling = SCALINGS[case]
    rope = {**scaling, "rope_theta": 10000.0}
    if family == "gemma3":  # per layer type: the local layers keep their own theta, unscaled
        rope = {"full_attention": rope, "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}
    ours, _ = compare(build(family, tmp_path, max_position_embeddings=ORIGINAL * 4, rope_parameters=rope))
    assert ours.cfg.rope_scaling["rope_type"] == scaling["rope_type"]


def test_phi3_longrope_and_partial_rotation(tmp_path):
    rotated_pairs = 4  # head_dim 16, partial_rotary_factor 0.5
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "short_factor": [1.0 + i / 8 for i in range(rotated_pairs)],
            "long_factor": [2.0 + i for i in range(rotated_pairs)]}
    ours, _ = compare(build("phi3", tmp_path, max_position_embeddings=ORIGINAL * 4,
                           original_max_position_embeddings=ORIGINAL, rope_parameters=rope))
    assert ours.cfg.rotary_percentage == 0.5 and ours.cfg.rope_scaling["rope_type"] == "longrope"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_saved_back_loads_in_transformers(tmp_path, family):
    ours = Llama.from_hf(build(family, tmp_path / "in")).double()
    save_hf(ours, tmp_path / "out")
    hf, back = load_hf(tmp_path / "out"), Llama.from_hf(tmp_path / "out").double()
    with torch.no_grad():
        expected = ours(PROMPT)
        assert_close(back(PROMPT), expected)
        assert_close(hf(PROMPT).logits, expected)


@pytest.mark.parametrize("family", ["mistral", "qwen2", "gemma3"])
def test_window_inside_a_map_equals_the_window_as_a_mask(tmp_path, family):
    """Under a map the sliding layers' window lives in the map (position_maps/window.py), without one it is
    attention's mask: Self-Extend with group 1 is plain RoPE, so the two must agree, cached or not."""
    plain = Llama.from_hf(build(family, tmp_path)).double()
    mapped = Llama.from_hf(tmp_path, attention_extension={"type": "self_extend", "group_size": 1, "window": 2})
    mapped = mapped.double()
    assert mapped.local_schemes is not None
    with torch.no_grad():
        assert_close(mapped(PROMPT), plain(PROMPT))
    assert_close(our_cached_logits(mapped, PROMPT), our_cached_logits(plain, PROMPT))
