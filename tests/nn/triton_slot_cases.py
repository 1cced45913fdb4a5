"""The static decode step's Triton attention under a map (posenc/nn/triton/slots.py, the dispatch's slot_triton)
equals map_slot_attention, its reference, over small caches: several shares of the slots with a ragged last one,
GQA, M+1 in {2, 3, 4} query rows per head, W = Dh, 2 Dh and 3 Dh (padded), slots no map scores, empty slots at the
end, a share that scores no slot; float32 to float64's rounding (the interpreter multiplies float32 exactly), bf16
and fp16 no farther from float64 than map_slot_attention in their own type. Shares whose maxima lie far apart, and
scores whose map differs per slot, so a wrong merge or a wrong choice of map fails. And the static decoder of the
tiny Llama, whose layers the dispatch sends to slot_triton here, decodes as the ordinary cached decoding does.

Not collected by `make test` directly: tests/nn/test_triton_slot.py runs this file in a fresh process with
TRITON_INTERPRET=1 (tests/nn/triton_support.py says why).
"""

from __future__ import annotations

import functools

import pytest
import torch

from posenc.nn import dispatch
from posenc.nn import triton as gpu
from posenc.nn.static_attention import map_slot_attention
from posenc.nn.triton import slots
from tests.nn.triton_support import kernel_device

pytestmark = pytest.mark.skipif(not gpu.installed(), reason="triton is not installed")
INTERPRETED, DEVICE = kernel_device()
FLOAT32 = 1e-5 if INTERPRETED else 1e-4  # relative to max(1, max|reference|)
FACTOR = 3  # a 16-bit kernel's error against float64 at most this x map_slot_attention's own (triton_support)


def _inputs(batch: int, kv_heads: int, group: int, rows: int, head_dim: int, tables: int, slots_: int,
            seed: int = 0) -> tuple[torch.Tensor, ...]:
    """queries (B,H,M+1,W), keys (B,Hkv,L,W), values (B,Hkv,L,Dh), mask (B,1,1,M+1,L) in float64: each slot scored by
    one map drawn at random (row M, the key's, by none), about one slot in six by no map, the last three empty."""
    g = torch.Generator().manual_seed(seed)
    width, maps = tables * head_dim, rows - 1
    queries = torch.randn(batch, kv_heads * group, rows, width, generator=g, dtype=torch.float64) * 0.5
    keys = torch.randn(batch, kv_heads, slots_, width, generator=g, dtype=torch.float64)
    values = torch.randn(batch, kv_heads, slots_, head_dim, generator=g, dtype=torch.float64)
    mask = torch.full((batch, 1, 1, rows, slots_), float("-inf"), dtype=torch.float64)
    scorer = torch.randint(0, max(1, maps), (batch, slots_), generator=g)
    mask.scatter_(3, scorer[:, None, None, None, :], 0.0)
    unscored = torch.rand(batch, slots_, generator=g) < 1 / 6
    mask.masked_fill_(unscored[:, None, None, None, :], float("-inf"))
    mask[..., -3:] = float("-inf")
    mask[..., 0] = torch.where(torch.arange(rows) == 0, 0.0, float("-inf"))  # every row scores a slot
    return queries, keys, values, mask


def _run(tensors, dtype: torch.dtype, shares: int, skip: bool = False) -> tuple[torch.Tensor, slots.SlotPlan]:
    inputs = [t.to(device=DEVICE, dtype=dtype) for t in tensors]
    plan = slots.plan(*inputs, shares=shares, skip_unscored=skip)
    assert plan is not None, "the kernel declined"
    return slots.attend(plan, *inputs), plan


def _check(tensors, dtype: torch.dtype, shares: int, what: str, skip: bool = False) -> slots.SlotPlan:
    exact = map_slot_attention(*tensors)  # float64 on the CPU
    got, plan = _run(tensors, dtype, shares, skip)
    error = (got.cpu().double() - exact).abs().max().item()
    scale = max(1.0, exact.abs().max().item())
    if dtype == torch.float32:
        bound = FLOAT32 * scale
    else:  # the reference in the kernel's own type, as the dispatch's fallback runs it
        low = map_slot_attention(*(t.to(dtype) for t in tensors)).double()
        bound = FACTOR * (low - exact).abs().max().item() + 1e-6 * scale
    assert error <= bound, f"{what} {dtype}: max error {error:.3g} > {bound:.3g}"
    return plan


# (batch, KV heads, g, M+1, Dh, key tables, L, shares asked)
CASES = [
    (2, 2, 3, 3, 16, 2, 40, 3),  # Self-Extend's form (two maps, two tables), SmolLM2's g = 3; shares 16, 16, 8
    (1, 1, 1, 2, 16, 1, 37, 4),  # one map, MHA: rows padded to 16 by the group; shares 16, 16, 5
    (2, 1, 2, 4, 32, 1, 50, 2),  # DCA's form (three maps, one table)
    (1, 2, 4, 3, 16, 3, 45, 3),  # W = 3 Dh = 48, padded to 64
    (1, 1, 2, 4, 16, 2, 48, 3),  # every block whole (EVEN: no masked load)
    (1, 1, 3, 3, 16, 1, 30, 1),  # one share: the merge of one
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("skip", [False, True], ids=["dense", "skip"])
def test_the_kernel_equals_map_slot_attention(case, dtype, skip):
    *shape, shares = case
    plan = _check(_inputs(*shape), dtype, shares, str(case), skip)
    assert plan.shares == min(shares, -(-shape[-1] // plan.tiles.bn)), plan  # the shares asked, as many as fit


def test_fp16_equals_map_slot_attention():
    _check(_inputs(2, 2, 3, 3, 16, 2, 40), torch.float16, 3, "fp16")


def test_a_share_that_scores_no_slot_weighs_nothing():
    """Slots 16-31 (the second share) scored by no map: its max is -inf and its sum 0."""
    queries, keys, values, mask = _inputs(1, 2, 3, 3, 16, 2, 40)
    mask[..., 16:32] = float("-inf")
    _check((queries, keys, values, mask), torch.float32, 3, "empty share")


def test_shares_whose_maxima_lie_far_apart_merge_by_their_maxima():
    """The first share's scores ~20 above the others' (its keys scaled up along the queries): a merge that weighed
    the shares alike, or by their sums without their maxima, fails; so does one that loses the last, ragged share."""
    queries, keys, values, mask = _inputs(1, 1, 3, 3, 16, 1, 40)
    queries = queries.abs()
    keys = keys.abs()
    keys[:, :, :16] *= 4.0
    keys[:, :, 32:] *= 2.0
    for shares in (1, 3):
        _check((queries, keys, values, mask), torch.float32, shares, f"{shares} shares")


def test_each_slot_takes_the_map_its_mask_names():
    """Scores that differ per map by far (map m's query scaled by 1 + 4m): a kernel that took another map's score
    (the first's, the largest's, or one head's map for another's) moves the output by far more than the bound."""
    queries, keys, values, mask = _inputs(1, 1, 3, 4, 16, 1, 40, seed=3)
    queries = queries * (1 + 4 * torch.arange(4, dtype=torch.float64))[:, None]
    exact = map_slot_attention(queries, keys, values, mask)
    first_map = map_slot_attention(queries, keys, values, torch.where(
        torch.arange(4)[:, None] == 0, mask.amax(3, keepdim=True), float("-inf")))  # every slot under map 0
    assert (first_map - exact).abs().max() > 0.1  # the case tells the maps apart
    _check((queries, keys, values, mask), torch.float32, 3, "maps apart")


def test_under_skip_a_block_no_map_scores_is_not_read_and_one_map_alone_is_enough():
    """skip_unscored: slots 16-31 (a whole block of BN = 16 here) scored by no map hold NaN keys and values: a pass
    that read them would put NaN in every output (NaN + -inf is NaN). Slots 32-47 scored by the second map only (the
    first masks them all): a pass that skipped a block by one map's mask would drop them. Against the reference with
    zeros in the unread block, float32 and bf16; the dense pass (no skip) reads the NaN, as it must."""
    queries, keys, values, mask = _inputs(1, 2, 3, 3, 16, 2, 50, seed=5)
    mask[..., 16:32] = float("-inf")
    mask[..., 0, 32:48], mask[..., 1, 32:48] = float("-inf"), 0.0
    exact = map_slot_attention(queries, keys, values, mask)
    keys[:, :, 16:32], values[:, :, 16:32] = float("nan"), float("nan")
    for dtype in (torch.float32, torch.bfloat16):
        got, plan = _run((queries, keys, values, mask), dtype, 3, skip=True)
        assert plan.tiles.bn == 16 or not INTERPRETED, plan
        bound = (FLOAT32 if dtype == torch.float32 else 2e-2) * max(1.0, exact.abs().max().item())
        assert torch.isfinite(got).all(), f"{dtype}: an unscored block was read"
        assert (got.cpu().double() - exact).abs().max().item() <= bound, dtype
    dense, _ = _run((queries, keys, values, mask), torch.float32, 3)
    assert torch.isnan(dense).any()  # the case tells the two passes apart


@pytest.fixture
def served(monkeypatch) -> list[tuple[int, bool]]:
    """The slots of each layer plan slot_triton made (it must serve, not decline to slot_torch), and whether the plan
    skips blocks no map scores."""
    planned: list[tuple[int, bool]] = []
    planner = dispatch.SLOT_KERNELS["slot_triton"]

    def counted(queries, keys, v, mask, skip_unscored=False):
        attend = planner(queries, keys, v, mask, skip_unscored)
        if attend is not None:
            planned.append((keys.shape[2], skip_unscored))
        return attend

    monkeypatch.setitem(dispatch.SLOT_KERNELS, "slot_triton", counted)
    return planned


# (the map, the prompt's length, the static cache's tokens, whether its plan skips unscored blocks)
DECODERS = [
    ({"type": "dual_chunk", "chunk_size": 8, "local_window": 2, "trained_length": 10}, 12, 24, False),
    # LM-Infinite over 64 slots in blocks of 16: slots 16-31 fall outside the window, 48-63 stay empty: skipped
    ({"type": "lm_infinite", "n_global": 2, "window": 6}, 40, 56, True),
]


@pytest.mark.parametrize(("spec", "prompt_length", "tokens", "skips"), DECODERS, ids=["dual_chunk", "lm_infinite"])
@torch.no_grad()
def test_the_static_decoder_on_the_kernel_decodes_as_the_float64_cached_decoding(served, spec, prompt_length, tokens,
                                                                                  skips):
    """The tiny Llama, one layer under DCA (three maps, m(T)^2 past its trained length; the steps cross its chunk
    edge at 16) or LM-Infinite (whose plan skips the blocks no map scores), in float32 with its map step on
    slot_triton (two shares): every step's logits as the float64 model's ordinary cached decoding (the eager map
    path, which the existing references check) gives them, to float32's rounding. (Self-Extend's two key tables: the
    cases above.)"""
    from posenc.models.static_decode import StaticDecoder
    from tests.models.static_support import cached_logits
    from tests.position_maps.tiny import tiny_llama, token_ids

    exact = tiny_llama(attention_extension=spec, n_layer=1).to(DEVICE)  # float64
    prompt = token_ids(1, prompt_length).to(DEVICE)
    want, steps = cached_logits(exact, prompt, 6)
    decoder = StaticDecoder(exact.float(), 1, tokens, cuda_graph=False)
    got = [decoder.prefill(prompt), *(decoder.step(token) for token in steps)]
    assert served == [(decoder.terms.slots, skips)], served  # one plan, the layer's, for every step
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(g.double(), w, rtol=0, atol=1e-4 * max(1.0, w.abs().max().item()),
                                   msg=f"step {step}")


@pytest.mark.skipif(INTERPRETED, reason="a CUDA graph needs a CUDA device")
@torch.no_grad()
def test_the_captured_step_on_the_kernel_replays_the_eager_step_bit_for_bit(served):
    """On CUDA in bf16 (the benchmark's form): the graph captured at the first step and replayed at every other runs
    the planned kernel and its merge, with no host read, and gives the eager static step's logits exactly."""
    from posenc.models.static_decode import StaticDecoder
    from tests.position_maps.tiny import tiny_llama, token_ids

    spec = {"type": "self_extend", "group_size": 3, "window": 5}
    model = tiny_llama(attention_extension=spec, dtype=torch.bfloat16).to(DEVICE)
    prompt = token_ids(1, 12).to(DEVICE)
    # 1008 slots: 16 blocks of 64, four shares on any GPU (SPLIT_MIN_BLOCKS each)
    graphed, eager = StaticDecoder(model, 1, 1000), StaticDecoder(model, 1, 1000, cuda_graph=False)
    token = graphed.prefill(prompt).argmax(-1, keepdim=True)
    eager.prefill(prompt)
    for step in range(6):
        got, want = graphed.step(token), eager.step(token)
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"step {step}")
        token = want.argmax(-1, keepdim=True)
    assert graphed._graph is not None and len(served) == 2 * model.cfg.n_layer, served


def test_shapes_past_the_limits_decline_to_the_pytorch_path():
    inputs = [t.to(DEVICE) for t in _inputs(1, 1, 1, 2, 16, 1, 20)]
    assert slots.plan(*(t.double() for t in inputs)) is None  # float64: PyTorch's
    wide = [t.float() for t in _inputs(1, 1, 32, 4, 16, 1, 20)]  # g 32 x 4 rows: past a program's rows
    assert slots.plan(*wide) is None
    assert dispatch.slot_attention_for(*wide) is map_slot_attention
    served = dispatch.slot_attention_for(*(t.float() for t in inputs))
    assert isinstance(served, functools.partial) and served.func is slots.attend
