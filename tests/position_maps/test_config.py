"""attention_extension in the configs: bad input refused before any work, in one line naming the field, the value
and what is allowed; a valid dict round-trips and switches in place."""

from __future__ import annotations

import pytest
import torch

from posenc.errors import ConfigError
from posenc.models import GPTConfig
from posenc.models.llama import Llama, LlamaConfig
from posenc.registry import POSITION_MAPS, build_position_map
from tests.position_maps.tiny import tiny_llama, token_ids

TINY = dict(vocab_size=61, n_layer=1, n_head=4, n_kv_head=2, d_model=32, ffn_hidden_size=64, max_seq_len=64)

BAD = [
    ({"type": "self_extnd", "group_size": 2, "window": 4}, "attention_extension.type='self_extnd' is unknown"),
    ({"group_size": 2}, "attention_extension.type=None is unknown"),
    ("self_extend", "attention_extension='self_extend' is not allowed"),
    ({"type": "self_extend", "group_size": 2}, "self_extend needs window"),
    ({"type": "self_extend", "group_size": 2, "window": 4, "windw": 3}, "unknown key 'attention_extension.windw'"),
    ({"type": "self_extend", "group_size": 0, "window": 4}, "attention_extension.group_size=0 is not allowed"),
    ({"type": "self_extend", "group_size": 2, "window": 2.5}, "attention_extension.window=2.5 is not allowed"),
    ({"type": "self_extend", "group_size": True, "window": 4}, "attention_extension.group_size=True"),
    ({"type": "dual_chunk", "chunk_size": 8, "local_window": 8}, "attention_extension.local_window=8 is not allowed"),
    ({"type": "dual_chunk", "chunk_size": 1}, "attention_extension.chunk_size=1 is not allowed"),
    ({"type": "lm_infinite", "n_global": -1}, "attention_extension.n_global=-1 is not allowed"),
    ({"type": "attention_sinks", "window": 0}, "attention_extension.window=0 is not allowed"),
]


@pytest.mark.parametrize(("spec", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_is_one_line_naming_the_field(spec, message):
    with pytest.raises(ConfigError) as error:
        LlamaConfig(**TINY, attention_extension=spec)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(("config", "message"), [
    (lambda spec: GPTConfig(position_embedding_type="alibi", attention_extension=spec),
     "None with position_embedding_type='alibi'"),
    (lambda spec: GPTConfig(position_embedding_type="learned_absolute", attention_extension=spec),
     "None with position_embedding_type='learned_absolute'"),
    (lambda spec: LlamaConfig(**TINY, rope_scaling={"rope_type": "dynamic", "factor": 2.0}, attention_extension=spec),
     "None with rope_scaling 'dynamic'"),
])
def test_refused_where_it_cannot_apply(config, message):
    with pytest.raises(ConfigError, match=message):
        config({"type": "self_extend", "group_size": 2, "window": 4})


def test_refused_before_reading_the_weights(tmp_path):
    with pytest.raises(ConfigError, match=r"attention_extension\.type"):
        Llama.from_gguf(tmp_path / "missing.gguf", attention_extension={"type": "nope"})


def test_defaults_follow_the_trained_length():
    assert build_position_map({"type": "dual_chunk"}, 8192).spec() == {
        "type": "dual_chunk", "chunk_size": 6144, "local_window": 1024, "scale": True,
        "trained_length": 8192}  # ChunkLlama's release since 2024-04: 3/4 and 1/8, its attention scale past 8192
    assert build_position_map({"type": "dual_chunk", "scale": False, "local_window": 512}, 8192).spec() == {
        "type": "dual_chunk", "chunk_size": 6144, "local_window": 512, "scale": False,
        "trained_length": None}  # the earlier defaults, one option away
    assert build_position_map({"type": "lm_infinite"}, 8192).spec() == {
        "type": "lm_infinite", "n_global": 10, "window": 8192, "max_distance": 8192}
    assert build_position_map({"type": "attention_sinks"}, 8192).spec() == {
        "type": "attention_sinks", "n_sink": 4, "window": 8188}  # the cache fits the trained length
    assert build_position_map(None, 8192) is None


@pytest.mark.parametrize("name", sorted(POSITION_MAPS))
def test_every_method_round_trips_through_the_config(name):
    spec = build_position_map({"type": name, **({"group_size": 2, "window": 8} if name == "self_extend" else {})},
                              64).spec()
    cfg = GPTConfig(position_embedding_type="rope", attention_extension=spec)
    assert GPTConfig(**cfg.to_dict()) == cfg
    assert build_position_map(cfg.attention_extension, 64) == build_position_map(spec, 64)


@torch.no_grad()
def test_switching_in_place_and_back():
    model = tiny_llama()
    ids = token_ids(1, 40)
    plain = model(ids)
    model.set_attention_extension({"type": "self_extend", "group_size": 4, "window": 8})
    extended = model(ids)
    model.set_rope_scaling({"rope_type": "linear", "factor": 2.0})  # keeps the extension, composes
    assert model.cfg.attention_extension["type"] == "self_extend"
    assert (model(ids) - extended).abs().max().item() > 1e-3
    model.set_rope_scaling(None).set_attention_extension(None)
    assert (model(ids) - plain).abs().max().item() == 0.0
    assert (extended - plain).abs().max().item() > 1e-3


def test_the_fused_kernel_is_refused_where_its_backward_would_be_wrong():
    from posenc.nn.mapped_attention import mapped_attention

    scheme = tiny_llama(attention_extension={"type": "self_extend", "group_size": 2, "window": 4}).schemes[0]
    q, k, v = (torch.randn(1, h, 8, 16, dtype=torch.float64, requires_grad=True) for h in (4, 2, 2))
    pos = torch.arange(8)[None]
    with pytest.raises(ConfigError, match="fused=True is not allowed"):
        mapped_attention(q, k, v, scheme.inner, scheme.position_map, pos, pos, fused=True)
