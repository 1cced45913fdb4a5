"""Hugging Face checkpoint folders: a model exported with save_hf_llama loads back with the same
logits, transformers' own LlamaForCausalLM reads the folder to the same logits (an independent
implementation), the built-in GGUF round-trips through such a folder, and bad folders are named."""

from __future__ import annotations

import json

import pytest
import torch

from posenc.experiments.extend.config import ExtendConfig, ModelOptions
from posenc.experiments.extend.model import load_model
from posenc.models import Llama, LlamaConfig
from posenc.models.hf_llama import config_fields, save_hf_llama
from tests.conftest import smollm2_gguf

transformers = pytest.importorskip("transformers")


def tiny_llama(interleaved: bool) -> Llama:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, n_layer=2, n_head=4, n_kv_head=2, d_model=32, ffn_hidden_size=64,
                      max_seq_len=128, rotary_base=5000.0, rotary_interleaved=interleaved, tie_word_embeddings=False)
    return Llama(cfg).eval()


def hf_logits(directory, ids) -> torch.Tensor:
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(ids).logits


IDS = torch.randint(0, 97, (1, 50), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("interleaved", [True, False], ids=["gguf-pairs", "hf-pairs"])
def test_export_loads_back_and_in_transformers(tmp_path, interleaved):
    model = tiny_llama(interleaved)
    save_hf_llama(model, tmp_path)
    loaded = Llama.from_hf(tmp_path)
    assert not loaded.cfg.rotary_interleaved and loaded.cfg.rotary_base == 5000.0
    with torch.no_grad():
        ours, back = model(IDS), loaded(IDS)
    torch.testing.assert_close(back, ours, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hf_logits(tmp_path, IDS), ours, rtol=1e-4, atol=1e-4)


def test_checkpoint_scaling_is_kept_or_replaced(tmp_path):
    model = tiny_llama(False).set_rope_scaling({"rope_type": "linear", "factor": 2.0})
    save_hf_llama(model, tmp_path)
    assert Llama.from_hf(tmp_path).cfg.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert Llama.from_hf(tmp_path, {"rope_type": "yarn", "factor": 4.0}).cfg.rope_scaling["rope_type"] == "yarn"
    with pytest.raises(ValueError, match="own rope_scaling"):  # extend compares scalings of plain RoPE
        load_model(ExtendConfig(model=ModelOptions(path=str(tmp_path))))


def test_transformers_5_rope_parameters_are_read():
    hf = {"num_attention_heads": 4, "hidden_size": 32, "vocab_size": 10, "num_hidden_layers": 1,
          "intermediate_size": 8, "max_position_embeddings": 64,
          "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}
    fields = config_fields(hf)
    assert fields["rotary_base"] == 500000.0 and fields["rope_scaling"]["rope_type"] == "llama3"
    assert "rope_theta" not in fields["rope_scaling"]
    assert config_fields({**hf, "rope_parameters": {"rope_theta": 1e4, "rope_type": "default"}})["rope_scaling"] is None


@pytest.mark.parametrize(("change", "named"), [
    ({"model_type": "gpt2"}, "model_type"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "relu"}, "hidden_act"),
    ({"head_dim": 16}, "shape"),  # the config's head_dim against the tensors' rows
    ({"attention_bias": True}, "bias"),  # the config promises biases the folder lacks
])
def test_unsupported_configs_are_named(tmp_path, change, named):
    save_hf_llama(tiny_llama(False), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError, match=named):
        Llama.from_hf(tmp_path)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"config\.json"):
        Llama.from_hf(tmp_path)
    save_hf_llama(tiny_llama(False), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="safetensors"):
        Llama.from_hf(tmp_path)


@pytest.mark.pretrained
def test_builtin_gguf_round_trips_through_a_checkpoint_folder(tmp_path):
    gguf = Llama.from_gguf(smollm2_gguf())
    save_hf_llama(gguf, tmp_path, gguf.tokenizer)
    model = load_model(ExtendConfig(model=ModelOptions(path=str(tmp_path))))  # what `posenc extend --model DIR` loads
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)"
    ids = torch.tensor([gguf.tokenizer.encode(text)])
    assert model.tokenizer.encode(text) == ids[0].tolist()
    with torch.no_grad():
        ours, loaded = gguf(ids), model(ids)
    scale = ours.abs().max()
    assert (loaded - ours).abs().max() / scale < 1e-5
    assert (hf_logits(tmp_path, ids) - ours).abs().max() / scale < 1e-4
