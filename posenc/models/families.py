"""The Llama family of decoders as data: one entry per architecture, one model (posenc.models.llama) for all.

An entry says how a member differs from Llama in *structure* (where the norms sit, what they scale by, which
projections carry biases or norms, what the embeddings are multiplied by) and in *names* (its transformers
class, which checkpoint tensors are fused). Sizes and per-checkpoint values (head_dim, sliding_window,
layer_types, softcapping, query_pre_attn_scalar, the local rotary base) are read from each checkpoint's
config.json into LlamaConfig. Code reads these fields and never asks which family it holds (as litgpt's
config_hub keeps its models as data).

Sources: transformers 5's modeling_{llama,qwen2,qwen3,mistral,gemma2,gemma3,phi3,olmo2}.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from posenc.errors import unknown_name

# Norm slots of a block: before/after attention, before/after the MLP. Each family names the slots it has by
# its checkpoint's module name, so state dicts keep transformers' names.
SLOTS = ("attn_in", "attn_out", "mlp_in", "mlp_out")
PRE_NORM = (("attn_in", "input_layernorm"), ("mlp_in", "post_attention_layernorm"))
SANDWICH = (("attn_in", "input_layernorm"), ("attn_out", "post_attention_layernorm"),
            ("mlp_in", "pre_feedforward_layernorm"), ("mlp_out", "post_feedforward_layernorm"))
POST_NORM = (("attn_out", "post_attention_layernorm"), ("mlp_out", "post_feedforward_layernorm"))
QK_NORMS = (None, "head", "all")  # per head over Dh (Qwen3, Gemma 3), or over all heads' H*Dh at once (OLMo 2)
EXTENSION_LAYERS = ("all", "global")  # every layer, or the full-attention ("global") layers only


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.json's model_type values this entry reads
    architecture: str  # transformers' causal-LM class, written into a saved config.json
    norm_slots: tuple[tuple[str, str], ...] = PRE_NORM  # (slot, module name)
    norm_offset: float = 0.0  # RMSNorm scales by (offset + weight): Gemma stores weight - 1
    qkv_bias: bool = False  # biases on q, k, v (not o), whatever attention_bias says (Qwen2)
    qk_norm: str | None = None
    embed_scale: bool = False  # embeddings times sqrt(d_model), rounded to the weights' dtype (Gemma)
    # checkpoint tensors holding several of ours, concatenated on dim 0 in this order (Phi-3)
    fused: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    activation: str = "silu"  # the MLP's gate where a file does not name it (GGUF)
    activation_key: str = "hidden_act"  # the config.json key its transformers class reads the MLP's gate from
    sliding_pattern: int | None = None  # config.json without layer_types: every n-th layer global, the rest slide
    # llama.cpp GGUF files: their general.architecture; whether the converter permuted q/k rows into adjacent
    # pairs (its "normal" rope: Llama); tensors whose GGUF name holds a fused HF one (Phi-3's ffn_up is gate_up);
    # the sliding layers' theta llama.cpp assumes where the file has none (Gemma 3)
    gguf_arch: str | None = None
    gguf_interleaved: bool = False
    gguf_parts: Mapping[str, str] = field(default_factory=dict)
    gguf_local_base: float | None = None
    # The layers a rope_scaling and a position map act on by default (LlamaConfig.extension_layers): all, or the
    # full-attention ones only, as transformers scales Gemma 3 (its local layers never see past their window)
    extension_layers: str = "all"

    def __post_init__(self) -> None:
        assert set(self.norms) <= set(SLOTS) and self.qk_norm in QK_NORMS, self  # a table typo, not user input
        assert self.extension_layers in EXTENSION_LAYERS, self

    @property
    def norms(self) -> dict[str, str]:
        """slot -> the checkpoint's module name."""
        return dict(self.norm_slots)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", ("llama",), "LlamaForCausalLM", gguf_arch="llama", gguf_interleaved=True),
    Family("mistral", ("mistral",), "MistralForCausalLM"),  # llama.cpp writes Mistral as arch llama, no window
    Family("qwen2", ("qwen2",), "Qwen2ForCausalLM", qkv_bias=True, gguf_arch="qwen2"),
    Family("qwen3", ("qwen3",), "Qwen3ForCausalLM", qk_norm="head", gguf_arch="qwen3"),
    Family("gemma2", ("gemma2",), "Gemma2ForCausalLM", SANDWICH, norm_offset=1.0, embed_scale=True,
           activation="gelu_pytorch_tanh", activation_key="hidden_activation", sliding_pattern=2, gguf_arch="gemma2"),
    Family("gemma3", ("gemma3_text",), "Gemma3ForCausalLM", SANDWICH, norm_offset=1.0, qk_norm="head",
           embed_scale=True, activation="gelu_pytorch_tanh", activation_key="hidden_activation", sliding_pattern=6,
           gguf_arch="gemma3", gguf_local_base=10000.0, extension_layers="global"),
    Family("phi3", ("phi3",), "Phi3ForCausalLM",
           fused={"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                  "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")},
           gguf_arch="phi3", gguf_parts={"ffn_up": "mlp.gate_up_proj"}),
    Family("olmo2", ("olmo2",), "Olmo2ForCausalLM", POST_NORM, qk_norm="all", gguf_arch="olmo2"),
)}


def family(name: str) -> Family:
    if name not in FAMILIES:
        raise unknown_name("family", name, FAMILIES)
    return FAMILIES[name]


def family_of_gguf_arch(arch: object) -> Family:
    """The entry reading a GGUF's general.architecture, or a one-line error listing those posenc reads."""
    for entry in FAMILIES.values():
        if entry.gguf_arch is not None and entry.gguf_arch == arch:
            return entry
    raise unknown_name("general.architecture", str(arch), [f.gguf_arch for f in FAMILIES.values() if f.gguf_arch])


def family_of_model_type(model_type: object) -> Family:
    """The entry reading a config.json's model_type, or a one-line error listing those posenc reads."""
    for entry in FAMILIES.values():
        if model_type in entry.model_types:
            return entry
    raise unknown_name("config.json model_type", str(model_type), [t for f in FAMILIES.values() for t in f.model_types])


__all__ = ["EXTENSION_LAYERS", "FAMILIES", "SLOTS", "Family", "family", "family_of_gguf_arch", "family_of_model_type"]
