"""Where the GPU time goes, for the cases the first GPU run found slow (BENCHMARKS-gpu.md, 2026-11-26 H200): each
case warmed up, then run under torch.profiler; per case the host's wall time per call against the kernels' own
time (a host-bound call shows a wall far above its kernels), the host syncs per call, and the operators and kernels
that take the time.

    python -m benchmarks.gpu_profile [--cases rope_backward,kerple_backward,...] [--quick --device cpu]

Cases (bf16 on a GPU): rope_backward (RoPE forward+backward, 1x32x4096x128), kerple_backward, relative_backward
(T5's table trained per bucket inside dQ) and alibi_backward
(attention forward+backward, B=4, T=4096, Dh 64, 16 heads), alibi_1k (the forward at B=16, T=1024: the launch-bound
end), decode_none (the ordinary eager decode step of the 12 x 768 GPT against a 4k cache), train_step_none, _rope,
_alibi and _kerple (the target table's training step of GPT-2 small, 8 x 1024 tokens), self_extend_prompt and
lm_infinite_prompt_32k (a 16k / 32k prompt's attention under the map, Dh 128, GQA 32:8), static_step_rope_32k,
static_step_self_extend_32k and static_step_dual_chunk_32k (the SmolLM2-shaped static decode step at a 32k cache, run
eagerly: the kernels its graph replays), slot_triton_* and slot_torch_* (one layer's attention of that step under
Self-Extend's, DCA's and LM-Infinite's forms: the Triton kernel against map_slot_attention's PyTorch ops),
slot_triton_dense_lm_infinite_32k (the kernel's pass that reads every block, against the one that skips what the map
leaves unscored) and slot_sdpa_rope_32k (RoPE's, SDPA over as many slots).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch.autograd import DeviceType

from benchmarks.gpu_sections import _forward_backward, attention_cells, training_step
from posenc.models import GPT, GPTConfig
from posenc.nn import dispatch
from posenc.registry import POSITION_MAPS
from posenc.rotary._core import apply_rotary, cos_sin, inv_frequencies

SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "aten::_local_scalar_dense")


def rope_backward(device, dtype, quick):
    b, h, t, d = (1, 2, 32, 16) if quick else (1, 32, 4096, 128)
    x = torch.randn(b, h, t, d, device=device, dtype=dtype, requires_grad=True)
    cos, sin = (c.to(device) for c in cos_sin(torch.arange(t)[None], inv_frequencies(d, 10000.0)))
    return _forward_backward(lambda: apply_rotary(x, cos, sin, False), [x])


def _attention(name, backward, batch, t, device, dtype, quick):
    heads, dh, batch, t = (2, 16, 1, 64) if quick else (16, 64, batch, t)
    q, k, v = (torch.randn(batch, heads, t, dh, device=device, dtype=dtype, requires_grad=backward) for _ in range(3))
    return attention_cells(name, q, k, v, device, backward, peers=False)[f"posenc {name}"]


def decode_none(device, dtype, quick):
    layers, d_model, heads, context = (2, 64, 2, 64) if quick else (12, 768, 12, 4096)
    model = GPT(GPTConfig(vocab_size=50304, n_layer=layers, n_head=heads, d_model=d_model, max_seq_len=context + 512,
                          position_embedding_type="none")).to(device).eval().to(dtype)
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 50304, (1, context), device=device), cache=cache)
    token = torch.zeros(1, 1, dtype=torch.long, device=device)

    def step():
        with torch.no_grad():
            return model(token, cache=cache)
    return step


def train_step(name: str):
    """The GPU benchmark's training step (gpu_sections.train_rows: GPT-2 small, 12 x 768, 12 heads, 8 x 1024 tokens,
    AdamW, autocast) under `name`: whether its distance to `none`'s (rope 0.76, alibi 0.65 on the H200) is host time
    (a wall above the kernels' sum) or the kernels' own, and which kernels."""
    def case(device, dtype, quick):
        if quick:
            return training_step(name, 2, 64, 2, 32, 2, device, dtype, vocab=256)
        return training_step(name, 12, 768, 12, 1024, 8, device, dtype)
    return case


def static_step(name: str, context: int):
    """The SmolLM2-shaped static decode step (gpu_decode_graphs' model `name`) run eagerly: the kernels its CUDA graph
    replays, each in the kernel table (the graphed step at 32k: maps ~1.8 ms over RoPE's 2.0, H200 2026-11-27)."""
    def case(device, dtype, quick):
        from benchmarks.gpu_decode_graphs import loaded_decoder, models

        t = 64 if quick else context
        _, _, decoder = loaded_decoder(models(0, 0, 0, t, quick)[name], t, device, dtype)
        token = torch.zeros(1, 1, dtype=torch.int64, device=device)

        def step():
            with torch.no_grad():
                return decoder.step(token)
        return step
    return case


# The static step's attention of one layer under a map, SmolLM2's shapes (9:3 heads, Dh 64): (maps M, key tables)
SLOT_FORMS = {"self_extend": (2, 2), "dual_chunk": (3, 1), "lm_infinite": (2, 2)}


def slot_case(kind: str, form: str, slots: int):
    """One layer's attention of the static step over `slots` slots, SmolLM2's shapes: kind slot_triton (the kernel
    and its merge) or slot_torch (map_slot_attention's PyTorch ops), planned as the dispatch plans a layer (the
    graphed map step at 32k: ~60 us a layer over RoPE's, H200 2026-11-27); kind slot_triton_dense: the kernel's pass
    that reads every block (against slot_triton's, which skips the blocks LM-Infinite's window leaves unscored: its
    mask scores the last quarter of the slots and the first four, as a model trained at a quarter would); kind sdpa
    with form "rope": RoPE's slot_attention over as many slots (SDPA's flash-decoding), the bar."""
    def case(device, dtype, quick):
        from posenc.nn.static_attention import slot_attention

        n, heads, kv, dh = (64, 4, 2, 16) if quick else (slots, 9, 3, 64)
        if kind == "sdpa":
            q = torch.randn(1, heads, 1, dh, device=device, dtype=dtype)
            k, v = (torch.randn(1, kv, n, dh, device=device, dtype=dtype) for _ in range(2))
            row = torch.zeros(1, 1, 1, n, device=device, dtype=dtype)
            return lambda: slot_attention(q, k, v, row)
        maps, tables = SLOT_FORMS[form]
        queries = torch.randn(1, heads, maps + 1, tables * dh, device=device, dtype=dtype)
        keys = torch.randn(1, kv, n, tables * dh, device=device, dtype=dtype)
        v = torch.randn(1, kv, n, dh, device=device, dtype=dtype)
        scorer = torch.randint(0, maps, (1, 1, 1, 1, n), device=device)  # each slot under one map drawn at random
        mask = torch.full((1, 1, 1, maps + 1, n), float("-inf"), device=device, dtype=dtype).scatter_(3, scorer, 0.0)
        skip = POSITION_MAPS[form].scores_few_slots and kind != "slot_triton_dense"
        if form == "lm_infinite":  # map 0 the window (the last quarter), map 1 the first four keys, the rest none
            mask.fill_(float("-inf"))
            mask[..., 0, n - n // 4 :], mask[..., 1, :4] = 0.0, 0.0
        attend = dispatch.SLOT_KERNELS[kind.removesuffix("_dense")](queries, keys, v, mask, skip)
        if attend is None and quick:  # the code paths only: the dispatch's choice where the kernel does not serve
            attend = dispatch.slot_attention_for(queries, keys, v, mask)
        if attend is None:
            raise RuntimeError(f"{kind} does not serve {dtype} on {device}")
        return lambda: attend(queries, keys, v, mask)
    return case


def map_prompt(spec: dict, t: int):
    """A prompt's attention under the map `spec` (gpu_sections.MAP_SPECS, defaults from a trained t/4), Dh 128, GQA
    32:8: the maps' prompt kernel (H200 2026-11-27, at 32k: Self-Extend 0.97x RoPE + SDPA, LM-Infinite 2.11x)."""
    def case(device, dtype, quick):
        from benchmarks.gpu_sections import _mapped_rope
        from posenc.scheme import Dims

        n, dh, heads, kv = (64, 16, 4, 2) if quick else (t, 128, 32, 8)
        dims = Dims(d_model=heads * dh, n_head=heads, head_dim=dh, max_seq_len=n // 4, n_kv_head=kv)
        _, mapped = _mapped_rope(spec, dims, device)
        q = torch.randn(1, heads, n, dh, device=device, dtype=dtype)
        k, v = (torch.randn(1, kv, n, dh, device=device, dtype=dtype) for _ in range(2))
        pos = torch.arange(n, device=device)[None]

        def call():
            with torch.no_grad():
                return dispatch.attention(q, k, v, mapped, pos, pos, True)
        return call
    return case


CASES: dict[str, Callable] = {
    "rope_backward": rope_backward,
    "kerple_backward": lambda device, dtype, quick: _attention("kerple", True, 4, 4096, device, dtype, quick),
    "relative_backward": lambda device, dtype, quick: _attention("relative", True, 4, 4096, device, dtype, quick),
    "alibi_backward": lambda device, dtype, quick: _attention("alibi", True, 4, 4096, device, dtype, quick),
    "alibi_1k": lambda device, dtype, quick: _attention("alibi", False, 16, 1024, device, dtype, quick),
    # FIRE and CoPE at the shape where a fixed ~0.8 ms per call showed (H200, 2026-11-26): host or the kernels'
    # work per token (FIRE's knot loops near the diagonal, CoPE's gated tiles)?
    **{f"{name}{suffix}_1k": lambda device, dtype, quick, name=name, backward=backward: _attention(
        name, backward, 16, 1024, device, dtype, quick)
       for name in ("fire", "cope") for suffix, backward in (("", False), ("_backward", True))},
    "decode_none": decode_none,
    **{f"train_step_{name}": train_step(name) for name in ("none", "rope", "alibi", "kerple")},
    "self_extend_prompt": map_prompt({"type": "self_extend", "group_size": 8, "window": 1024}, 16384),
    "lm_infinite_prompt_32k": map_prompt({"type": "lm_infinite"}, 32768),
    "static_step_rope_32k": static_step("smollm2-shaped", 32768),
    "static_step_self_extend_32k": static_step("smollm2-shaped self_extend", 32768),
    "static_step_dual_chunk_32k": static_step("smollm2-shaped dual_chunk", 32768),
    # one layer's attention of the static step at 32k slots: the map kernel alone against map_slot_attention's ops
    # and RoPE's SDPA (bytes: Self-Extend's keys are twice RoPE's, DCA's as RoPE's)
    **{f"{kind}_{form}_32k": slot_case(kind, form, 32768) for form in SLOT_FORMS
       for kind in ("slot_triton", "slot_torch")},
    "slot_triton_dense_lm_infinite_32k": slot_case("slot_triton_dense", "lm_infinite", 32768),
    "slot_sdpa_rope_32k": slot_case("sdpa", "rope", 32768),
}


def profile(name: str, call: Callable, device: torch.device, calls: int, rows: int) -> None:
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(3):
        call()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    sync()
    wall = (time.perf_counter() - start) / calls
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            call()
        sync()
    events = prof.key_averages()
    # The kernels' own rows only: the operator (or autograd Function) that launched a kernel carries its time too,
    # so summing every row counted each kernel twice (2026-11-26: 'kernels' above the wall for kerple_backward).
    device_us = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / calls if cuda \
        else float("nan")
    syncs = {e.key: e.count // calls for e in events if e.key in SYNCS and e.count}
    print(f"\n## {name}: wall {1e3 * wall:.3f} ms per call, kernels {device_us / 1e3:.3f} ms per call, "
          f"host syncs per call {syncs or 0}")
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    print(events.table(sort_by=sort, row_limit=rows, max_name_column_width=70))
    if cuda:
        print(events.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=70))


def python_profile(name: str, call: Callable, device: torch.device, calls: int, rows: int) -> None:
    """Where the host's time goes in Python (cProfile, own time per function): a call whose kernels take a tenth of
    its wall (RoPE forward+backward on the H200: 0.045 of 0.563 ms) spends the rest in the launcher's binding,
    autograd or posenc's own Python; torch.profiler's table books all of it as the autograd Function's self time."""
    import cProfile
    import pstats

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        call()
    sync()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    sync()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, function) -> (calls, primitive, own s, cumulative s, callers)
    own = sorted(stats.items(), key=lambda item: -item[1][2])[:rows]
    total = sum(entry[2] for entry in stats.values())
    print(f"\n## {name} (python): {1e6 * total / calls:.0f} us of Python per call (cProfile's clock, its own cost "
          f"included)\n  own us/call  cum us/call  calls/call  function")
    for (file, line, function), (count, _, own_s, cum_s, _) in own:
        print(f"  {1e6 * own_s / calls:11.1f}  {1e6 * cum_s / calls:11.1f}  {count / calls:10.1f}  "
              f"{function} ({file.rsplit('/', 2)[-1] if '/' in file else file}:{line})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="toy sizes (the code paths only)")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--rows", type=int, default=12)
    parser.add_argument("--python", action="store_true", help="cProfile's own time per Python function instead")
    args = parser.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        parser.error(f"--cases: unknown {unknown}; allowed: {', '.join(CASES)}")
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    print(f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}: torch {torch.__version__}")
    for name in names:
        try:
            run = python_profile if args.python else profile
            run(name, CASES[name](device, dtype, args.quick), device, args.calls, args.rows)
        except Exception as error:  # one case's failure leaves the others' tables
            print(f"\n## {name}: failed: {type(error).__name__}: {error}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
