"""A user's torch.compile(model): what posenc's models give when compiled whole, as nanoGPT or a trainer does.

Schemes without a bias (the plain form: absolute, rotary, none) trace as one graph, training step included: no host
read (input checks, position extremes, the memory check, memos keyed on tensors) is left in the traced code, so
fullgraph=True holds. Schemes with a bias, position maps, and layers with a window or a soft cap run their attention
outside the graph, one break per layer (posenc's kernels: ctypes calls on the CPU, Triton launches with host reads on
CUDA; paths chosen by the positions' values), and compute what eager computes. The backend is aot_eager: the graphs,
forward and backward, that Inductor would compile, run by PyTorch's own kernels (no C++ compile in the test; under
Inductor, random draws and float sums differ from eager's)."""

from __future__ import annotations

import warnings

import pytest
import torch

from posenc.contract.models import perturb_scheme_parameters
from posenc.models import GPT, GPTConfig, limits
from posenc.nn import decoder_attention, dispatch
from posenc.registry import SCHEMES
from tests.models.static_support import VOCAB, gemma_like

PLAIN = sorted(name for name, cls in SCHEMES.items() if dispatch.form_of(cls) == "plain")
BIASED = sorted(set(SCHEMES) - set(PLAIN))


def gpt(name: str, dtype: torch.dtype = torch.float64) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=4, n_kv_head=2, d_model=32, max_seq_len=1024,
                          position_embedding_type=name, dropout=0.0))
    perturb_scheme_parameters(model, 0)
    return model.to(dtype)


def llama(**changes) -> torch.nn.Module:
    """A Llama (float64, as static_support draws them); gemma_like() itself with no changes."""
    plain = dict(family="llama", layer_types=None, sliding_window=None, local_rotary_base=None, hidden_act="silu",
                 query_pre_attn_scalar=None)
    return gemma_like(**{**plain, **changes})


def training_step(model: torch.nn.Module, run, ids: torch.Tensor, **inputs) -> tuple[torch.Tensor, list]:
    """(loss, every parameter's gradient) of one next-token step; abacus draws its offsets from the seed set here."""
    model.zero_grad()
    torch.manual_seed(1)
    out = run(ids, **inputs)
    logits = out[0] if isinstance(out, tuple) else out
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def assert_compiled_equals_eager(model: torch.nn.Module, fullgraph: bool, length: int = 40, **inputs) -> None:
    """float64 models to 1e-10 (the traced paths compute the eager formulas, summed in another order); float32
    models (posenc's CPU kernels serve float32 only) to float32's rounding."""
    ids = torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(2))
    model.train()
    tolerance = dict(rtol=1e-10, atol=1e-12) if next(model.parameters()).dtype == torch.float64 else \
        dict(rtol=1e-4, atol=1e-5)
    want_loss, want_grads = training_step(model, model, ids, **inputs)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=fullgraph)
    got_loss, got_grads = training_step(model, compiled, ids, **inputs)
    torch.testing.assert_close(got_loss, want_loss, **tolerance)
    assert len(got_grads) == len(want_grads)
    for got, want in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, **tolerance)


@pytest.mark.parametrize("name", PLAIN)
def test_a_scheme_without_a_bias_trains_compiled_as_one_graph(name):
    """fullgraph=True: a graph break (a host read, a memo the tracer cannot follow) is an error. Nothing warns: the
    dispatch's functools caches are constants to the tracer, not traced through (dynamo warns when it does)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_compiled_equals_eager(gpt(name), fullgraph=True)
    assert not [w for w in caught if "posenc" in str(w.message) or "lru_cache" in str(w.message)], \
        [str(w.message)[:200] for w in caught]


def test_explicit_positions_trace_as_one_graph():
    positions = torch.arange(40).expand(2, 40) + 7  # the shift test's positions
    assert_compiled_equals_eager(gpt("rope"), fullgraph=True, position_ids=positions)


def test_a_llama_trains_compiled_as_one_graph(monkeypatch):
    """With the memory check on (at real sizes it reads /proc/meminfo: a break, were it traced)."""
    monkeypatch.setattr(limits, "SMALL_REQUEST", 0)
    assert_compiled_equals_eager(llama(), fullgraph=True)


@pytest.mark.parametrize("shape", ["gemma3", "softcap"])
def test_a_windowed_or_capped_layer_leaves_only_its_attention_out_of_the_graph(shape):
    """Gemma 3's sliding layer (its full one stays in the graph), Gemma 2's soft-capped scores: the path reads the
    positions (window reached or not, blocks), so the layer's attention runs outside the graph, by eager's code."""
    model = gemma_like() if shape == "gemma3" else llama(attn_logit_softcapping=5.0)
    assert breaks(model) == {(decoder_attention.__file__, "_attend")}


def breaks(model: torch.nn.Module) -> set[tuple[str, str]]:
    """(file, function) of the frames where the graph breaks of a training forward fall (explain reports a break
    once per frame it splits: counts depend on the nesting and torch's version, places do not)."""
    torch._dynamo.reset()
    model.train()
    explained = torch._dynamo.explain(model)(torch.randint(0, VOCAB, (2, 40)))
    return {(frame.filename, frame.name) for frame in (r.user_stack[-1] for r in explained.break_reasons)}


@pytest.mark.parametrize("name", BIASED)
def test_a_scheme_with_a_bias_leaves_only_its_attention_out_of_the_graph(name):
    """Breaks only at the dispatch's attention call (posenc's kernels run there as in eager)."""
    assert breaks(gpt(name, torch.float32)) == {(dispatch.__file__, "attention")}


def test_a_position_map_leaves_only_its_attention_out_of_the_graph():
    model = gemma_like(family="llama", layer_types=None, sliding_window=None, local_rotary_base=None,
                       hidden_act="silu", query_pre_attn_scalar=None,
                       attention_extension={"type": "self_extend", "group_size": 2, "window": 8})
    assert breaks(model) == {(dispatch.__file__, "attention")}


@pytest.mark.parametrize("name", ["alibi", "fire", "transformer_xl"])
def test_a_scheme_with_a_bias_computes_compiled_what_it_computes_eager(name):
    """At a length where posenc's CPU kernels serve (rows per head, FIRE's pieces, rows per query), between the
    graphs: the loss and every gradient are eager's."""
    assert_compiled_equals_eager(gpt(name, torch.float32), fullgraph=False, length=1024)


def test_the_dispatch_decisions_are_constants_for_the_compiler():
    """Every decision carries the mark torch.compiler.assume_constant_result would set (set directly: that marker
    imports torch._dynamo); if torch renames the mark, the comparison fails here."""
    def probe():
        return None

    torch.compiler.assume_constant_result(probe)
    assert vars(probe) == {dispatch.MARKED_CONSTANT: True}
    decisions = (dispatch.form_of, dispatch.plan, dispatch.rotation_plan, dispatch.slot_plan, dispatch.traced_in_graph)
    assert all(getattr(decide, dispatch.MARKED_CONSTANT, False) for decide in decisions)
