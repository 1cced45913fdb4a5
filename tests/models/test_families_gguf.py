"""A GGUF of every family llama.cpp converts, written from a tiny transformers checkpoint as llama.cpp's converter
writes it (tests/models/family_gguf.py), loads in posenc with transformers' logits for that checkpoint; where
transformers itself reads such GGUFs, its loader agrees on the same file (so the writer keeps llama.cpp's
conventions, not only posenc's)."""

from __future__ import annotations

import pytest
import torch

from posenc.models import Llama
from posenc.models.families import FAMILIES as TABLE
from tests.models.family_checkpoints import build, load_hf
from tests.models.family_gguf import write_gguf
from tests.models.test_families import PROMPT, assert_close, our_cached_logits

pytest.importorskip("gguf")
pytest.importorskip("transformers")
GGUF_FAMILIES = sorted(name for name, f in TABLE.items() if f.gguf_arch is not None)
# transformers' own GGUF loader: the architectures it maps (integrations/ggml.py); its config mapping leaves out
# Gemma's soft-capping, query scalar and local theta, and takes Qwen3's head_dim as its config default (128), so
# those files are checked against posenc alone; it has no OLMo 2
TRANSFORMERS_READS = {"llama", "qwen2", "phi3"}
# GGUF has no query_pre_attn_scalar: llama.cpp scales Gemma's scores by key_length^-1/2 (its 27B sizes apart), so
# the checkpoints written here use that scale. Qwen's sliding layers are not written by llama.cpp's converter (nor
# read by transformers').
GGUF_CHANGES = {"gemma2": {"query_pre_attn_scalar": 16}, "gemma3": {"query_pre_attn_scalar": 32},
                "qwen2": {"use_sliding_window": False}}


@pytest.mark.parametrize("family", GGUF_FAMILIES)
def test_gguf_logits_equal_the_checkpoint(tmp_path, family):
    hf = load_hf(build(family, tmp_path / "hf", **GGUF_CHANGES.get(family, {})))
    path = write_gguf(hf.float(), tmp_path / f"{family}.gguf")
    hf = hf.double()
    ours = Llama.from_gguf(path).double()
    assert ours.cfg.family == family
    with torch.no_grad():
        expected = hf(PROMPT).logits
        assert_close(ours(PROMPT), expected)
    assert_close(our_cached_logits(ours, PROMPT), our_cached_logits(Llama.from_hf(tmp_path / "hf").double(), PROMPT))
    if family in TRANSFORMERS_READS:
        from transformers import AutoModelForCausalLM

        theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float64)
        with torch.no_grad():
            assert_close(theirs.eval()(PROMPT).logits, expected)


def test_phi3_longrope_factors_are_read_from_their_tensors(tmp_path):
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0 + i / 8 for i in range(8)],
            "long_factor": [2.0 + i for i in range(8)]}
    hf = load_hf(build("phi3", tmp_path / "hf", max_position_embeddings=64, original_max_position_embeddings=16,
                       rope_parameters=rope))
    ours = Llama.from_gguf(write_gguf(hf.float(), tmp_path / "phi3.gguf")).double()
    assert ours.cfg.rope_scaling["long_factor"] == rope["long_factor"]
    with torch.no_grad():
        assert_close(ours(PROMPT), hf.double()(PROMPT).logits)
