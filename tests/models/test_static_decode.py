"""The static decode step (posenc.models.static_decode): equal to the ordinary cached decoding for every scheme it
serves (GPT) and for a Gemma-3-shaped decoder past its window; bit for bit once its attention over the padded cache
is swapped for the ordinary attention over the filled slots; free of host syncs in its captured part; and every
refusal one line, before any work."""

from __future__ import annotations

import pytest
import torch

from posenc import registry
from posenc.models.static_decode import StaticDecoder, served_schemes
from posenc.models.static_terms import StepScheme
from posenc.nn import dispatch
from posenc.registry import SCHEMES
from posenc.scheme import Scheme
from tests.models.host_syncs import HostSyncError, NoHostSync
from tests.models.static_support import VOCAB, cached_logits, gemma_like, gpt

STEPS = 8
# SDPA over L slots, the empty ones at -inf, sums in another order than over the filled ones: float64 rounding
ATOL = 1e-12
SCALINGS = [{"rope_type": "yarn", "factor": 4.0}, {"rope_type": "dynamic", "factor": 2.0}]


def static_logits(model, prompt: torch.Tensor, tokens: list[torch.Tensor], max_len: int = 24) -> list[torch.Tensor]:
    decoder = StaticDecoder(model, prompt.shape[0], max_len)
    return [decoder.prefill(prompt), *(decoder.step(token) for token in tokens)]


def assert_same_decoding(model, prompt: torch.Tensor, steps: int = STEPS) -> None:
    want, tokens = cached_logits(model, prompt, steps)
    got = static_logits(model, prompt, tokens)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(g, w, rtol=0, atol=ATOL, msg=lambda m, step=step: f"step {step}: {m}")
        assert torch.equal(g.argmax(-1), w.argmax(-1)), f"greedy token differs at step {step}"


def prompt(batch: int = 2, length: int = 5, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", served_schemes())
def test_static_decoding_equals_cached_decoding_for_every_served_scheme(name):
    assert_same_decoding(gpt(name), prompt())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cope_with_a_learned_table_decodes_alike(dtype):
    """CoPE's table starts at zero (its bias then is 0 whatever the gates count): drawn here, every layer's, so the
    step's count of gates over the filled slots decides the logits. float32 takes the step's one product of q with
    the keys for the gates and the scores alike."""
    model = gpt("cope").to(dtype)
    with torch.no_grad():
        for scheme in model.schemes.modules():
            if isinstance(getattr(scheme, "table", None), torch.nn.Parameter):
                scheme.table.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(3))
    if dtype == torch.float64:
        assert_same_decoding(model, prompt())
        return
    want, tokens = cached_logits(model, prompt(), STEPS)
    for step, (g, w) in enumerate(zip(static_logits(model, prompt(), tokens), want, strict=True)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=lambda m, step=step: f"step {step}: {m}")


def test_shaw_decodes_alike_past_its_clipping_distance():
    """Keys farther than k = 2 share the clipped rows of P_K and P_V: the step's index clamps as eq. 5 clips."""
    assert_same_decoding(gpt("shaw", shaw_max_relative_position=2), prompt())


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s["rope_type"])
def test_static_decoding_equals_cached_decoding_under_rope_scalings(scaling):
    """dynamic too: its frequencies follow the length, and the step's tables are computed on the host at each step."""
    assert_same_decoding(gpt("rope", max_seq_len=8, rope_scaling=scaling), prompt())


def test_a_gemma3_shaped_decoder_decodes_alike_past_its_window():
    """Two RoPE bases (local 10k, global 1M), a window of 6 on the sliding layer, 16 steps: keys leave the window."""
    assert_same_decoding(gemma_like(), prompt(), steps=16)


def _ordinary_attention(decoder: StaticDecoder):
    """StepScheme.attend replaced by the ordinary path's attention over the filled slots only."""
    def attend(self, q, k, v, q_pos, k_pos, causal, dropout=0.0):
        layer = decoder._layers.index(self)
        n = decoder.length + 1  # the step's slot is filled
        positions = decoder.terms.positions
        qp, kp = decoder.terms.framing.frame(positions[:, n - 1 : n], positions[:, :n])
        scheme, attn = decoder.terms.schemes[layer], decoder.model.blocks[layer].attn
        k, v = k[:, :, :n], v[:, :, :n]
        if hasattr(attn, "_attend"):  # DecoderAttention: windows and soft-capping
            return attn._attend(q, k, v, scheme, qp, kp, None)
        return dispatch.attention(q, k, v, scheme, qp, kp, True)
    return attend


@pytest.mark.parametrize("name", ["rope", "xpos", "alibi", "fire", "learned_absolute", "gemma3"])
def test_everything_but_the_attention_over_the_padded_cache_is_bit_for_bit(name, monkeypatch):
    """With the ordinary attention over the filled slots in place of slot_attention, every logit of every step is
    the ordinary decoding's, bit for bit: the terms, the rotation, the cache writes and the rest are exact."""
    model = gemma_like() if name == "gemma3" else gpt(name)
    want, tokens = cached_logits(model, prompt(), STEPS + 8)
    decoder = StaticDecoder(model, 2, 24)
    monkeypatch.setattr(StepScheme, "attend", _ordinary_attention(decoder))
    got = [decoder.prefill(prompt()), *(decoder.step(token) for token in tokens)]
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), f"step {step}: {(g - w).abs().max().item():.3g}"


def test_generate_with_a_static_cache_gives_the_cached_tokens():
    for model in (gpt("alibi"), gemma_like()):
        ids = prompt()
        assert torch.equal(model.generate(ids, 12, static_cache=True), model.generate(ids, 12))


@pytest.mark.parametrize("name", ["rope", "xpos", "alibi", "fire", "learned_absolute", "abacus", "shaw", "cope",
                                  "transformer_xl", "gemma3"])
def test_the_captured_part_reads_nothing_back_to_the_host(name):
    model = gemma_like() if name == "gemma3" else gpt(name)
    decoder = StaticDecoder(model, 2, 24)
    token = decoder.prefill(prompt()).argmax(-1, keepdim=True)
    decoder.step(token)  # the first step allocates the buffers
    with torch.no_grad(), NoHostSync():
        decoder.heavy()


def test_the_sync_check_fails_on_the_ordinary_step():
    """The check can fail: the ordinary cached step reads ids and positions on the host."""
    model, cache = gpt("rope"), None
    with torch.no_grad():
        cache = model.new_cache()
        token = model(prompt(), cache=cache)[:, -1:].argmax(-1)
        with pytest.raises(HostSyncError, match="host sync: "), NoHostSync():
            model(token, cache=cache)


class _BiasFromPositions(Scheme):
    """A user's scheme with a bias() alone: the static step has no row for it."""

    def bias(self, q_pos, k_pos, q=None, k=None):
        return -(q_pos[:, :, None] - k_pos[:, None, :]).abs().to(torch.float64)[:, None] / 8  # (B,1,Tq,Tk)


@pytest.fixture
def user_bias():
    registry.register("user_bias", _BiasFromPositions)
    yield "user_bias"
    SCHEMES.pop("user_bias")


def test_every_registered_scheme_is_served():
    assert served_schemes() == sorted(SCHEMES)


def test_a_refused_scheme_is_one_line_naming_it_and_what_is_served(user_bias):
    with pytest.raises(ValueError) as err:
        StaticDecoder(gpt(user_bias), 1, 16)
    message = str(err.value)
    assert "\n" not in message and f"position_embedding_type={user_bias!r}" in message and "rope" in message
    assert "its attention form is 'bias'" in message


def test_cope_in_a_layer_with_a_sliding_window_is_refused_in_one_line():
    """The ordinary step counts CoPE's gates per block of a window; the static step over every filled slot."""
    with pytest.raises(ValueError, match="layer 0 has a sliding window") as err:
        StaticDecoder(gemma_like(position_embedding_type="cope", local_rotary_base=None), 1, 16)
    assert "\n" not in str(err.value)


class _RotatesWithoutTables(Scheme):
    def rotate(self, q, k, q_pos, k_pos):
        return q.flip(-1), k.flip(-1)


class _RowsWithoutTable(Scheme):
    def bias(self, q_pos, k_pos, q=None, k=None):
        raise AssertionError("not called: the refusal reads the class")

    def relative_rows(self, q, low, high):
        raise AssertionError("not called: the refusal reads the class")


def test_refusals_come_from_the_dispatch_form_and_hooks():
    assert dispatch.static_refusal(_RowsWithoutTable) == (
        "it gives rows per query without their table (Scheme.relative_table)")
    assert dispatch.static_refusal(_RotatesWithoutTables) == (
        "it rotates q and k without giving its tables (Scheme.rotation_tables)")
    # a rotary scheme under a position map is served (tests/models/test_static_map_decode.py), refused per instance
    assert dispatch.static_refusal(type(gemma_like(attention_extension={"type": "self_extend", "group_size": 2,
                                                                        "window": 4}).schemes[0])) is None


def test_bad_input_is_one_line_before_any_work(monkeypatch):
    model = gpt("rope")

    def no_work():
        raise AssertionError("work started")

    monkeypatch.setattr(model, "new_cache", no_work)
    decoder = StaticDecoder(model, 2, 8)
    cases = [(lambda: decoder.prefill(prompt(batch=3)), "input_ids.shape\\[0\\]=3"),
             (lambda: decoder.prefill(prompt(length=8)), "max_len=8 .*more than the prompt's 8 tokens"),
             (lambda: decoder.step(torch.zeros(2, 1, dtype=torch.int64)), "prefill\\(input_ids\\) first"),
             (lambda: decoder.step(torch.zeros(2, 2, dtype=torch.int64)), "token=.*shape \\(2, 1\\)"),
             (lambda: StaticDecoder(model, 0, 8), "batch=0"),
             (lambda: StaticDecoder(model.train(), 2, 8), "model.training=True"),
             (lambda: StaticDecoder(model, 2, 8, compiled=1), "compiled=1 .*True or False"),
             (lambda: StaticDecoder(gpt("learned_absolute"), 1, 65), "max_len=65 .*position")]
    for call, pattern in cases:
        with pytest.raises(ValueError, match=pattern) as err:
            call()
        assert "\n" not in str(err.value)
        model.eval()


def test_a_decoder_prefilled_again_forgets_the_positions_of_its_first_prompt():
    """The positions buffer is append-only between prefills (what the rows' checks and FIRE's frame read of it is
    kept): a second prompt, whose positions skip (a packed layout the fast rows refuse), decodes as a fresh
    decoder does and as the ordinary cached step does, after a first prompt whose positions counted up by one."""
    for name in ("alibi", "fire", "shaw", "transformer_xl"):  # Transformer-XL: a span its table did not cover
        model = gpt(name)
        again = StaticDecoder(model, 2, 24)
        token = again.prefill(prompt()).argmax(-1, keepdim=True)
        for _ in range(4):
            token = again.step(token).argmax(-1, keepdim=True)
        second, positions = prompt(seed=2), torch.tensor([[0, 1, 2, 40, 41], [3, 4, 5, 6, 50]])
        fresh = StaticDecoder(model, 2, 24)
        got, want = again.prefill(second, positions), fresh.prefill(second, positions)
        cache = model.new_cache()
        with torch.no_grad():
            ordinary = model(second, positions, cache)[:, -1]
        for step in range(5):
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=lambda m, s=step, n=name: f"{n} step {s}: {m}")
            torch.testing.assert_close(got, ordinary, rtol=0, atol=ATOL, msg=lambda m, s=step, n=name: f"{n} {s}: {m}")
            token, positions = got.argmax(-1, keepdim=True), positions[:, -1:] + 1
            got, want = again.step(token), fresh.step(token)
            with torch.no_grad():
                ordinary = model(token, positions, cache)[:, -1]


@pytest.mark.parametrize("name", ["shaw", "transformer_xl"])
def test_a_table_of_rows_per_query_follows_its_parameters_between_steps(name):
    """The step's copy of the scheme's table is formed again when a parameter changes (an optimizer step between
    two tokens): the decoding stays the ordinary step's."""
    model, ids = gpt(name), prompt()
    decoder, cache = StaticDecoder(model, 2, 24), model.new_cache()
    with torch.no_grad():
        want, got = model(ids, cache=cache)[:, -1], decoder.prefill(ids)
        for step in range(6):
            torch.testing.assert_close(got, want, rtol=0, atol=ATOL, msg=lambda m, s=step: f"step {s}: {m}")
            if step == 2:
                for scheme in model.schemes.modules():
                    for parameter in scheme.parameters(recurse=False):
                        parameter.mul_(1.5)
            token = want.argmax(-1, keepdim=True)
            want, got = model(token, cache=cache)[:, -1], decoder.step(token)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["alibi", "rope", "shaw", "cope", "gemma3"])  # one per kind of captured part
def test_the_compiled_step_decodes_as_the_eager_step(name):
    """On the CPU, part (b) under torch.compile (one graph, fullgraph) gives the eager static step's logits and the
    ordinary decoding's greedy tokens, step after step; for ALiBi a second decoder of other shapes compiles its own
    step (under a recompile limit of 1: decoders that shared one compiled function would fail at the second). FIRE's
    part is ALiBi's (a row), Transformer-XL's Shaw's without the value term; every served scheme traces as one graph
    (below)."""
    model = gemma_like() if name == "gemma3" else gpt(name)
    for max_len in (24, 40) if name == "alibi" else (24,):
        want, tokens = cached_logits(model, prompt(), STEPS)
        compiled, eager = StaticDecoder(model, 2, max_len, compiled=True), StaticDecoder(model, 2, max_len)
        torch.testing.assert_close(compiled.prefill(prompt()), eager.prefill(prompt()), rtol=0, atol=0)
        for step, token in enumerate(tokens, start=1):
            with torch._dynamo.config.patch(recompile_limit=1):
                got = compiled.step(token)
            torch.testing.assert_close(got, eager.step(token), rtol=0, atol=1e-12, msg=lambda m, s=step: f"{s}: {m}")
            assert torch.equal(got.argmax(-1), want[step].argmax(-1)), f"greedy token differs at step {step}"


@pytest.mark.slow
def test_generate_with_a_compiled_static_step_gives_the_cached_tokens():
    model, ids = gpt("alibi"), prompt()
    assert torch.equal(model.generate(ids, 12, static_cache=True, compiled=True), model.generate(ids, 12))


def test_compiled_without_a_static_cache_is_refused_before_any_work(monkeypatch):
    model = gpt("alibi")
    monkeypatch.setattr(model, "new_cache", lambda: pytest.fail("work started"))
    with pytest.raises(ValueError, match=r"compiled=True .*static_cache=True") as err:
        model.generate(prompt(), 4, compiled=True)
    assert "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("name", [*served_schemes(), "gemma3"])
def test_the_fixed_shape_part_of_the_step_is_one_graph_for_every_served_scheme(name):
    """What compiled=True compiles traces whole: one graph, no break, for every scheme the static step serves (a
    break would leave that part to Python at every step; fullgraph=True makes it an error at the first step)."""
    model = gemma_like() if name == "gemma3" else gpt(name)
    decoder = StaticDecoder(model, 2, 24)
    decoder.step(decoder.prefill(prompt()).argmax(-1, keepdim=True))  # the first step allocates the buffers
    with torch.no_grad():
        explained = torch._dynamo.explain(decoder.heavy)()
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_a_full_cache_is_refused():
    decoder = StaticDecoder(gpt("none"), 1, 6)
    token = decoder.prefill(prompt(batch=1)).argmax(-1, keepdim=True)
    decoder.step(token)
    with pytest.raises(ValueError, match=r"max_len=6 .*6 tokens already cached"):
        decoder.step(token)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["rope", "alibi", "fire", "shaw", "transformer_xl", "cope", "smollm2"])
def test_the_captured_step_replays_what_the_eager_step_computes(name):
    """On CUDA: the graph captured at the first step and replayed at every other gives the eager static step's
    logits (the same kernels) and the ordinary decoding's greedy tokens."""
    model = (gemma_like(family="llama", layer_types=None, sliding_window=None, local_rotary_base=None,
                        hidden_act="silu", query_pre_attn_scalar=None) if name == "smollm2" else gpt(name))
    model = model.float().cuda()
    ids = prompt().cuda()
    want, tokens = cached_logits(model, ids, 12)
    graphed, eager = StaticDecoder(model, 2, 32), StaticDecoder(model, 2, 32, cuda_graph=False)
    torch.testing.assert_close(graphed.prefill(ids), eager.prefill(ids), rtol=0, atol=0)
    for step, token in enumerate(tokens, start=1):
        got = graphed.step(token)
        torch.testing.assert_close(got, eager.step(token), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got, want[step], rtol=1e-4, atol=1e-4)
    assert graphed._graph is not None
