"""The GPU benchmark's measurements (benchmarks/gpu.py runs them). Each contender is timed on its own, back to back
with CUDA events (triton.testing.do_bench: median of ~100 ms of calls after warm-up, no host clock in the loop),
inside its own try: an out-of-memory or a failure is a cell that says so, and the next contender runs. Every row
goes to the sink as soon as it is measured. Ratios are to causal SDPA with its backend pinned and named
(attention), a same-bytes copy (RoPE) or `none` (models).
--quick runs these code paths on the CPU at toy sizes (host clock, no CUDA events) and measures nothing."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.timing import median_seconds
from posenc.models import GPT, GPTConfig
from posenc.nn import dispatch
from posenc.nn.attention_core import attend
from posenc.registry import build
from posenc.scheme import Dims, materialises_bias

# Triton kernels that build the bias per tile, no (T, T) tensor anywhere: rows per head (triton/attention.py),
# FIRE's pieces (triton/piecewise_attention.py), rows per query (triton/relative.py), CoPE (triton/cope.py)
TILED_SCHEMES = {"alibi", "kerple", "sandwich", "relative", "fire", "shaw", "transformer_xl", "cope"}
SQUARE_MAX_T = 4096  # other schemes' GPU paths still build (1, H, T, T) pieces in fwd+bwd: longer is an OOM
MATERIALISED_MAX_T = 8192  # the materialised (1, H, T, T) bias peer
Sink = Callable[[str, dict], None]


def seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds per call: CUDA events over back-to-back calls on a GPU, the host clock on the CPU."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e3
    return median_seconds(fn, repeats, warmup=1)


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float | str:
    """seconds(), or what stopped it ("OOM", or the error's first line): one contender never stops the rest."""
    try:
        return seconds(fn, device, repeats)
    except torch.OutOfMemoryError:
        return "OOM"
    except Exception as err:  # a contender that fails is a cell of the table, not the end of the run
        return f"error: {type(err).__name__}: {str(err).strip().splitlines()[0][:80] if str(err).strip() else ''}"
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _ratio(value: float | str, base: float | str) -> float | str:
    if isinstance(value, str) or isinstance(base, str) or not base:
        return float("nan")
    return value / base


def _forward_backward(fn: Callable[[], torch.Tensor], inputs: list[torch.Tensor]) -> Callable[[], object]:
    def call():
        out = fn()
        return torch.autograd.grad(out, inputs, torch.ones_like(out), allow_unused=True)

    return call


def _raise_recompile_limit() -> None:
    """One compiled flex per length and head dim: past dynamo's default limit (8-20 graphs) it would fall back to
    eager flex silently (and run out of memory at 16k). Raise the limit, and fail loudly where torch can."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 256))
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    _raise_recompile_limit()
    return torch.compile(flex_attention, dynamic=False)


def _flex(q, k, v, scheme, pos):
    """flex_attention with the scheme's score_mod and a causal block mask, compiled (the peer)."""
    from torch.nn.attention.flex_attention import create_block_mask

    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, q.shape[-2], k.shape[-2], device=q.device)
    score_mod = scheme.score_mod(pos, pos)
    gqa = k.shape[1] != q.shape[1]
    return lambda: _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=mask, enable_gqa=gqa)


def sdpa_backend(device: torch.device, dtype: torch.dtype):
    """(name, context) of the SDPA backend the baseline is pinned to: FlashAttention-2 for 16-bit types on CUDA."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        return "flash", lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])
    if device.type == "cuda":
        return "efficient", lambda: sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION])
    return "cpu default", lambda: sdpa_kernel([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION])


def _ours(q, k, v, scheme, pos):
    if materialises_bias(scheme):  # what SelfAttention runs after the rotation
        return lambda: dispatch.attention(q, k, v, scheme, pos, pos, True)
    return lambda: attend(q, k, v, None, True)


def attention_cells(name: str, q, k, v, device, backward: bool, peers: bool = True) -> dict[str, Callable[[], object]]:
    """posenc's path for the scheme, and (peers) flex with the score_mod and the materialised bias."""
    heads, t, head_dim = q.shape[1], q.shape[2], q.shape[3]
    dims = Dims(d_model=heads * head_dim, n_head=heads, head_dim=head_dim, max_seq_len=t, n_kv_head=k.shape[1])
    scheme = build(name, dims).to(device)
    pos = torch.arange(t, device=device)[None]
    cells = {f"posenc {name}": _ours(q, k, v, scheme, pos)}
    if peers and device.type == "cuda" and scheme.score_mod(pos, pos) is not None:
        cells[f"flex {name}"] = _flex(q, k, v, scheme, pos)
    if peers and materialises_bias(scheme) and not scheme.needs_weights and t <= MATERIALISED_MAX_T:
        cells[f"materialised {name}"] = lambda: attend(q, k, v, scheme.bias(pos, pos, q, k), True)
    if backward:
        inputs = [q, k, v, *(p for p in scheme.parameters() if p.requires_grad)]
        cells = {n: _forward_backward(fn, inputs) for n, fn in cells.items()}
    return cells


def attention_rows(schemes: list[str], lengths: list[int], head_dims: list[int], kv_groups: list[int],
                   tokens: int, repeats: int, device, dtype, sink: Sink, peers: bool = True) -> None:
    """Forward and forward+backward per scheme, length, head dim and GQA group, against causal SDPA. Batch
    B = tokens // T (at least 1) so short lengths are not timing launches; d_model = 1024 (H = 1024 // Dh)."""
    backend, pinned = sdpa_backend(device, dtype)
    for backward in (False, True):
        for head_dim in head_dims:
            heads = max(1, 1024 // head_dim)
            for group in kv_groups:
                for t in lengths:
                    batch = max(1, tokens // t)
                    g = torch.Generator().manual_seed(0)
                    try:
                        q = torch.randn(batch, heads, t, head_dim, generator=g).to(device, dtype)
                        k, v = (torch.randn(batch, heads // group, t, head_dim, generator=g).to(device, dtype)
                                for _ in range(2))
                    except torch.OutOfMemoryError:
                        continue
                    q, k, v = (x.requires_grad_(backward) for x in (q, k, v))
                    sdpa = lambda q=q, k=k, v=v, gqa=group > 1: F.scaled_dot_product_attention(
                        q, k, v, is_causal=True, enable_gqa=gqa)
                    call = _forward_backward(sdpa, [q, k, v]) if backward else sdpa

                    def baseline(call=call):
                        with pinned():
                            return call()

                    base = timed(baseline, device, repeats)
                    common = {"pass": "fwd+bwd" if backward else "fwd", "Dh": head_dim,
                              "H:Hkv": f"{heads}:{heads // group}", "B": batch, "T": t}
                    sink("attention", {**common, "path": f"causal SDPA ({backend})", "ms": _ms(base), "x SDPA": 1.0})
                    for name in schemes:
                        if name not in TILED_SCHEMES and t > SQUARE_MAX_T:
                            continue
                        for path, fn in attention_cells(name, q, k, v, device, backward, peers).items():
                            result = timed(fn, device, repeats)
                            sink("attention", {**common, "path": path, "ms": _ms(result),
                                               "x SDPA": _ratio(result, base)})


def _ms(value: float | str) -> float | str:
    return value if isinstance(value, str) else 1e3 * value


def _rope_peers(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> dict:
    """transformers' rotate_half formula and Liger's Triton kernel, where installed."""
    peers = {}
    full_cos, full_sin = (torch.cat((c, c), -1)[:, 0].to(x.dtype) for c in (cos, sin))  # (1,T,Dh)
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        peers["transformers rotate_half"] = lambda: apply_rotary_pos_emb(x, x, full_cos, full_sin)[0]
    except ImportError:
        pass
    try:
        from liger_kernel.ops.rope import LigerRopeFunction

        peers["Liger rope"] = lambda: LigerRopeFunction.apply(x, x, full_cos, full_sin)[0]
    except ImportError:
        pass
    return peers


def rope_rows(shapes: list[tuple[int, int, int, int]], repeats: int, device, dtype, sink: Sink) -> None:
    """Half-split and interleaved RoPE, forward and forward+backward, against a same-bytes copy."""
    from posenc.rotary._core import apply_rotary, cos_sin, inv_frequencies

    for b, h, t, d in shapes:
        x = torch.randn(b, h, t, d, device=device, dtype=dtype)
        cos, sin = (c.to(device) for c in cos_sin(torch.arange(t)[None], inv_frequencies(d, 10000.0)))
        out = torch.empty_like(x)
        for backward in (False, True):
            xg = x.detach().requires_grad_(backward)
            calls = {"copy": lambda out=out, x=x: out.copy_(x)}
            calls |= {f"posenc {p}": (lambda i=(p == "interleaved"), xg=xg, c=cos, s=sin: apply_rotary(xg, c, s, i))
                      for p in ("half-split", "interleaved")}
            calls |= _rope_peers(xg, cos, sin)
            if backward:
                calls = {n: (fn if n == "copy" else _forward_backward(fn, [xg])) for n, fn in calls.items()}
            copy = timed(calls.pop("copy"), device, repeats)
            copy_moves = copy * (2 if backward else 1) if not isinstance(copy, str) else copy  # fwd+bwd: twice
            common = {"pass": "fwd+bwd" if backward else "fwd", "B,H,T,Dh": f"{b},{h},{t},{d}"}
            sink("rope", {**common, "path": "copy", "us": _us(copy_moves), "x copy": 1.0})
            for name, fn in calls.items():
                result = timed(fn, device, repeats)
                sink("rope", {**common, "path": name, "us": _us(result), "x copy": _ratio(result, copy_moves)})


def _us(value: float | str) -> float | str:
    return value if isinstance(value, str) else 1e6 * value


def _gpt(name: str, layers: int, d_model: int, heads: int, seq: int, device, vocab: int = 50304) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=vocab, n_layer=layers, n_head=heads, d_model=d_model, max_seq_len=seq,
                    position_embedding_type=name)
    return GPT(cfg).to(device)


def train_rows(schemes: list[str], layers: int, d_model: int, heads: int, seq: int, batch: int, repeats: int,
               device, dtype, sink: Sink) -> None:
    """One AdamW step of a GPT (GPT-2 small: 12 x 768, 12 heads at T = 1024) under autocast: tokens/s. `none`
    first: every other row's ratio is to it."""
    base = None
    for name in ["none", *(s for s in schemes if s != "none")]:
        try:
            step = training_step(name, layers, d_model, heads, seq, batch, device, dtype)
        except torch.OutOfMemoryError:
            sink("train", {"scheme": name, "ms/step": "OOM", "tokens/s": "OOM", "x none": float("nan")})
            continue
        result = timed(step, device, repeats)
        base = result if name == "none" else base
        tokens = float("nan") if isinstance(result, str) else batch * seq / result
        sink("train", {"scheme": name, "ms/step": _ms(result), "tokens/s": tokens,
                       "x none": _ratio(base, result) if base is not None else float("nan")})
        del step


def training_step(name: str, layers: int, d_model: int, heads: int, seq: int, batch: int, device, dtype,
                  vocab: int = 50304) -> Callable[[], None]:
    """One AdamW step of a fresh GPT under `name` on a fixed batch (batch, seq) of tokens, under autocast."""
    model = _gpt(name, layers, d_model, heads, seq, device, vocab).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    data = torch.randint(0, vocab, (batch, seq + 1), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype):
            loss = F.cross_entropy(model(data[:, :-1]).flatten(0, 1).float(), data[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def _decode_steps(models: dict[str, Callable[[], GPT]], context: int, repeats: int, device, section: str,
                  column: str, sink: Sink) -> None:
    """One token against a cache of `context` tokens (prefilled in chunks), per model built by `models`: ms per
    step and the ratio to the first model's step (the baseline, named in the ratio's column)."""
    base, first = None, next(iter(models))
    for name, make in models.items():
        try:
            model = make()
            cache = model.new_cache()
            with torch.no_grad():
                for start in range(0, context, 1024):  # chunked prefill
                    model(torch.randint(0, 50304, (1, min(1024, context - start)), device=device), cache=cache)
        except torch.OutOfMemoryError:
            sink(section, {"context": context, column: name, "ms/token": "OOM", f"x {first}": float("nan")})
            continue
        token = torch.zeros(1, 1, dtype=torch.long, device=device)

        def step(model=model, cache=cache, token=token):  # the cache grows by the timed steps: < 2% of 16k
            with torch.no_grad():
                return model(token, cache=cache)

        result = timed(step, device, repeats)
        base = result if name == first else base
        sink(section, {"context": context, column: name, "ms/token": _ms(result),
                       f"x {first}": _ratio(result, base) if base is not None else float("nan")})
        del model, cache


def decode_rows(schemes: list[str], context: int, layers: int, d_model: int, heads: int, repeats: int, device,
                dtype, sink: Sink) -> None:
    """One token against a cache of `context` tokens, per scheme: ms per step, ratio to `none`."""
    models = {name: (lambda name=name: _gpt(name, layers, d_model, heads, context + 64, device).eval().to(dtype))
              for name in ["none", *(s for s in schemes if s != "none")]}
    _decode_steps(models, context, repeats, device, "decode", "scheme", sink)


# Each method at 4x its trained length (a 32k prompt on an 8k model): the targets, <= 1.5x plain prefill and
# <= 1.3x a plain decode step. Options as the papers' long-context runs set them; the rest from the trained length.
MAP_SPECS = {"self_extend": {"type": "self_extend", "group_size": 8, "window": 1024},
             "dual_chunk": {"type": "dual_chunk"}, "lm_infinite": {"type": "lm_infinite"},
             "attention_sinks": {"type": "attention_sinks"}, "string": {"type": "string"}}


def _mapped_rope(spec: dict, dims: Dims, device):
    """The rope scheme of `dims` under the map `spec`, with the map's defaults from dims.max_seq_len."""
    from posenc.position_maps.scheme import PositionMapped
    from posenc.registry import build_position_map

    rope = build("rope", dims).to(device)
    return rope, PositionMapped(rope, build_position_map(spec, dims.max_seq_len))


def map_rows(maps: list[str], length: int, head_dim: int, heads: int, kv_heads: int, repeats: int, device, dtype,
             sink: Sink) -> None:
    """Prefill attention of one `length`-token prompt under each map (posenc's dispatch: on a GPU the one-pass Triton
    kernel, the keys' rotation included) against plain RoPE attention (the rotation, then causal SDPA pinned to
    its backend), and SDPA alone; the model trained at length // 4."""
    backend, pinned = sdpa_backend(device, dtype)
    dims = Dims(d_model=heads * head_dim, n_head=heads, head_dim=head_dim, max_seq_len=max(2, length // 4),
                n_kv_head=kv_heads)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, length, head_dim, generator=g).to(device, dtype)
    k, v = (torch.randn(1, kv_heads, length, head_dim, generator=g).to(device, dtype) for _ in range(2))
    pos = torch.arange(length, device=device)[None]
    rope = build("rope", dims).to(device)

    def sdpa(q=q, k=k):
        with pinned(), torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != heads)

    def plain():
        with torch.no_grad():
            return sdpa(*rope.rotate(q, k, pos, pos))

    common = {"T": length, "Dh": head_dim, "H:Hkv": f"{heads}:{kv_heads}"}
    base = timed(sdpa, device, repeats)
    sink("maps", {**common, "path": f"causal SDPA ({backend})", "ms": _ms(base), "x SDPA": 1.0,
                  "x rope": float("nan")})
    rope_time = timed(plain, device, repeats)
    sink("maps", {**common, "path": "rope + SDPA", "ms": _ms(rope_time), "x SDPA": _ratio(rope_time, base),
                  "x rope": 1.0})
    for name in maps:
        _, mapped = _mapped_rope(MAP_SPECS[name], dims, device)

        def ours(mapped=mapped):
            with torch.no_grad():
                return dispatch.attention(q, k, v, mapped, pos, pos, True)

        result = timed(ours, device, repeats)
        sink("maps", {**common, "path": f"posenc {name}", "ms": _ms(result), "x SDPA": _ratio(result, base),
                      "x rope": _ratio(result, rope_time)})


def map_decode_rows(maps: list[str], context: int, layers: int, d_model: int, heads: int, repeats: int, device,
                    dtype, sink: Sink) -> None:
    """One token against a cache of `context` tokens, a rope GPT trained at context // 4, plain and under each map."""

    def make(spec):
        return GPT(GPTConfig(vocab_size=50304, n_layer=layers, n_head=heads, d_model=d_model,
                             max_seq_len=max(2, context // 4), position_embedding_type="rope",
                             attention_extension=spec)).to(device).eval().to(dtype)

    models = {"rope": lambda: make(None), **{name: (lambda name=name: make(MAP_SPECS[name])) for name in maps}}
    _decode_steps(models, context, repeats, device, "map decode", "map", sink)


__all__ = ["MAP_SPECS", "attention_rows", "decode_rows", "map_decode_rows", "map_rows", "rope_rows", "seconds",
           "timed", "train_rows", "training_step"]
