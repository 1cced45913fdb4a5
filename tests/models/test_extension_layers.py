"""LlamaConfig.extension_layers: a rope_scaling or a position map acts on the layers chosen. On a tiny random
Gemma 3 (layer 0 slides over 6 tokens with its own theta, layer 1 is global), the default (global) leaves the
sliding layer's output exactly the plain model's while the global layer's changes; `all` changes both. The
same choice through posenc.hf.apply gives posenc's logits on transformers' own model."""

from __future__ import annotations

import pytest
import torch

import posenc.hf
from posenc.models import Llama, LlamaConfig
from posenc.models.hf_config import config_fields, hf_config
from tests.models.family_checkpoints import VOCAB, build, load_hf

pytest.importorskip("transformers")
PROMPT = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(5))
METHODS = {  # windows shorter than the sliding layer's 6 tokens, so a map moves positions the local layer sees
    "self_extend": {"attention_extension": {"type": "self_extend", "group_size": 2, "window": 3}},
    "linear": {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    "yarn+lm_infinite": {"rope_scaling": {"rope_type": "yarn", "factor": 2.0},
                         "attention_extension": {"type": "lm_infinite", "n_global": 1, "window": 4}},
}


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    directory = build("gemma3", tmp_path_factory.mktemp("gemma3"))
    return directory, Llama.from_hf(directory).double()


def block_outputs(model: Llama) -> list[torch.Tensor]:
    """Each block's output (B,T,D) on PROMPT."""
    outputs: list[torch.Tensor] = []
    hooks = [block.register_forward_hook(lambda _m, _i, out: outputs.append(out)) for block in model.blocks]
    with torch.no_grad():
        model(PROMPT)
    for hook in hooks:
        hook.remove()
    return outputs


def under(model: Llama, **changes) -> Llama:
    changed = Llama(model.cfg.replace(**changes)).double()
    changed.load_state_dict(model.state_dict())
    return changed.eval()


def test_gemma3_extends_its_global_layers_by_default(gemma3):
    cfg = gemma3[1].cfg
    assert cfg.layer_types == ("sliding_attention", "full_attention") and cfg.extension_layers == "global"
    assert LlamaConfig(family="llama").extension_layers == "all"


@pytest.mark.parametrize("method", sorted(METHODS))
def test_global_leaves_the_local_layer_alone_and_all_changes_it(gemma3, method):
    plain = block_outputs(gemma3[1])
    only_global = block_outputs(under(gemma3[1], extension_layers="global", **METHODS[method]))
    everywhere = block_outputs(under(gemma3[1], extension_layers="all", **METHODS[method]))
    assert torch.allclose(only_global[0], plain[0], rtol=0, atol=1e-12)  # the sliding layer: as without the method
    assert not torch.allclose(everywhere[0], plain[0], rtol=0, atol=1e-3)
    assert not torch.allclose(only_global[1], plain[1], rtol=0, atol=1e-3)  # the global layer: changed either way


@pytest.mark.parametrize("layers", ["global", "all"])
def test_transformers_under_apply_follows_the_choice(gemma3, layers):
    directory, ours = gemma3
    method = METHODS["yarn+lm_infinite"]
    hf = posenc.hf.apply(load_hf(directory), method["rope_scaling"], method["attention_extension"], layers)
    assert posenc.hf.applied(hf).extension_layers == layers
    with torch.no_grad():
        theirs, mine = hf(PROMPT).logits, under(ours, extension_layers=layers, **method)(PROMPT)
    assert (theirs - mine).abs().max().item() <= 2e-5 * theirs.abs().max().item()


def test_a_choice_is_saved_where_transformers_can_hold_it(gemma3):
    cfg = gemma3[1].cfg.replace(rope_scaling={"rope_type": "linear", "factor": 4.0}, extension_layers="all")
    assert config_fields(hf_config(cfg))["extension_layers"] == "all"  # Gemma 3: per layer type
    mistral = LlamaConfig(family="mistral", sliding_window=8, rope_scaling={"rope_type": "linear", "factor": 2.0},
                          extension_layers="all")
    with pytest.raises(ValueError, match=r"^extension_layers='global' is not allowed: all with a rope_scaling"):
        hf_config(mistral.replace(layer_types=("sliding_attention",) * 29 + ("full_attention",),
                                  extension_layers="global"))


def test_apply_refuses_a_choice_transformers_cannot_hold(tmp_path):
    hf = load_hf(build("qwen2", tmp_path))  # one rotary table for its sliding and full layers
    with pytest.raises(ValueError, match=r"^extension_layers='global' is not allowed: all for a rope_scaling alone"):
        posenc.hf.apply(hf, {"rope_type": "linear", "factor": 2.0}, None, "global")
    assert posenc.hf.applied(hf) is None


@pytest.mark.parametrize(("changes", "named"), [
    ({"extension_layers": "middle"}, "extension_layers='middle'"),
    ({"extension_layers": "global", "sliding_window": 8, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
     "extension_layers='global' is not allowed: all on a model whose layers all slide"),
])
def test_bad_choices_are_one_line(changes, named):
    with pytest.raises(ValueError) as err:
        LlamaConfig(family="mistral", **changes)
    assert str(err.value).startswith(named) and "\n" not in str(err.value)
