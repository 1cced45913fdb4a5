"""posenc.hf.apply on transformers' own models of every family: logits equal posenc's decoder loaded from the same
checkpoint under the same method (itself equal to transformers' plain model, tests/models/test_families.py),
greedy generation through transformers' cache gives posenc's tokens, and remove() gives the model back."""

from __future__ import annotations

import pytest
import torch

import posenc.hf
from posenc.models import Llama
from posenc.registry import POSITION_MAPS
from tests.models.family_checkpoints import FAMILIES, VOCAB, build, load_hf

pytest.importorskip("transformers")
PROMPT = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
TOLERANCE = 2e-5  # float32's, relative to the largest logit: transformers' rotary tables and norms are float32
METHODS = {
    "yarn": ({"rope_type": "yarn", "factor": 4.0}, None),
    "self_extend": (None, {"type": "self_extend", "group_size": 3, "window": 4}),
    "linear+lm_infinite": ({"rope_type": "linear", "factor": 2.0}, {"type": "lm_infinite", "n_global": 2, "window": 7}),
}
SOFTCAPPED = {"gemma2"}  # attn_logit_softcapping: the maps' attention refuses it


def assert_close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    scale = max(1.0, theirs.abs().max().item())
    assert (ours - theirs).abs().max().item() <= TOLERANCE * scale


def both(tmp_path, family: str, scaling, extension):
    directory = build(family, tmp_path)
    hf = load_hf(directory)
    ours = Llama.from_hf(directory, rope_scaling=scaling, attention_extension=extension).double()
    return posenc.hf.apply(hf, rope_scaling=scaling, attention_extension=extension), ours


CASES = [(f, m) for f in sorted(FAMILIES) for m in METHODS if not (f in SOFTCAPPED and METHODS[m][1])]


@pytest.mark.parametrize(("family", "method"), CASES)
def test_applied_model_equals_posenc_decoder(tmp_path, family, method):
    hf, ours = both(tmp_path, family, *METHODS[method])
    with torch.no_grad():
        assert_close(hf(PROMPT).logits, ours(PROMPT))
    theirs = hf.generate(PROMPT, max_new_tokens=6, do_sample=False, eos_token_id=None)  # through its cache
    assert torch.equal(theirs, ours.generate(PROMPT, max_new_tokens=6))


@pytest.mark.parametrize("method", ["yarn", "self_extend"])  # posenc's rotary tables; posenc's attention function
def test_a_users_loop_under_inference_mode_equals_no_grad(tmp_path, method):
    """A user's own loop (or a pipeline) under torch.inference_mode: a forward, a prefill, cached steps."""
    hf = posenc.hf.apply(load_hf(build("llama", tmp_path)), *METHODS[method])
    ids = PROMPT[:, :10]

    def run(mode) -> list[torch.Tensor]:
        with mode():
            out = hf(ids[:, :4], use_cache=True)
            outs, cache = [hf(ids).logits, out.logits], out.past_key_values
            for t in range(4, ids.shape[1]):
                out = hf(ids[:, t : t + 1], cache=cache, use_cache=True)
                outs.append(out.logits)
                cache = out.past_key_values
        return outs

    first = run(torch.inference_mode)
    assert all(torch.equal(a, b) for a, b in zip(first, run(torch.no_grad), strict=True))


def test_an_applied_rope_scaling_compiles_as_one_graph(tmp_path):
    """A user's torch.compile of the patched model: posenc's rotary tables trace into transformers' graph
    (fullgraph=True); logits and every gradient equal eager's. (A map's attention runs outside the graph, one break
    per layer: tests/models/test_user_compile.py, on posenc's own Llama.)"""
    hf = posenc.hf.apply(load_hf(build("llama", tmp_path)), *METHODS["yarn"])

    def step(run) -> tuple[torch.Tensor, list[torch.Tensor]]:
        hf.zero_grad()
        logits = run(PROMPT).logits
        logits.square().mean().backward()
        return logits.detach(), [p.grad.clone() for p in hf.parameters() if p.grad is not None]

    want, want_grads = step(hf)
    torch._dynamo.reset()
    got, got_grads = step(torch.compile(hf, backend="aot_eager", fullgraph=True))
    assert_close(got, want)
    assert len(got_grads) == len(want_grads)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert_close(a, b)


@pytest.mark.parametrize("name", sorted(POSITION_MAPS))
def test_every_registered_map_applies(tmp_path, name):
    """A map added later works through apply with its defaults (self_extend has none: given here)."""
    extension = {"type": name, **({"group_size": 2, "window": 6} if name == "self_extend" else {})}
    hf, ours = both(tmp_path, "qwen2", None, extension)  # q/k/v biases and a sliding layer
    with torch.no_grad():
        assert_close(hf(PROMPT).logits, ours(PROMPT))


def test_remove_restores_the_model(tmp_path):
    hf = load_hf(build("gemma3", tmp_path))  # two rotary tables, sliding layers
    rotary, implementation, layer_types = hf.model.rotary_emb, hf.config._attn_implementation, hf.config.layer_types
    with torch.no_grad():
        before = hf(PROMPT).logits
        posenc.hf.apply(hf, {"rope_type": "linear", "factor": 4.0}, {"type": "self_extend", "group_size": 2,
                                                                      "window": 4})
        assert posenc.hf.applied(hf).attention_extension["type"] == "self_extend"
        assert not torch.allclose(hf(PROMPT).logits, before)
        posenc.hf.remove(hf)
        assert torch.equal(hf(PROMPT).logits, before)
    assert hf.model.rotary_emb is rotary and hf.config._attn_implementation == implementation
    assert hf.config.layer_types == layer_types and posenc.hf.applied(hf) is None


@pytest.mark.parametrize(("scaling", "extension", "named"), [
    ({"rope_type": "yarn", "factor": 0.5}, None, "factor"),
    (None, {"type": "self_extend", "group_size": 2}, "window"),
    (None, {"type": "stretch"}, "attention_extension.type"),
])
def test_bad_methods_are_refused_before_the_model_changes(tmp_path, scaling, extension, named):
    hf = load_hf(build("mistral", tmp_path))
    rotary = hf.model.rotary_emb
    with pytest.raises(ValueError, match=named):
        posenc.hf.apply(hf, scaling, extension)
    assert hf.model.rotary_emb is rotary and posenc.hf.applied(hf) is None


def test_softcapped_attention_refuses_a_map(tmp_path):
    hf = load_hf(build("gemma2", tmp_path))
    with pytest.raises(ValueError, match="attn_logit_softcapping"):
        posenc.hf.apply(hf, attention_extension={"type": "lm_infinite"})


def test_a_model_of_another_family_is_named():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match="model_type"):
        posenc.hf.apply(model, {"rope_type": "linear", "factor": 2.0})
