"""The GPU benchmark's measurements (benchmarks/gpu.py runs them): every contender of a row is timed in one
process, interleaved (benchmarks/timing.py), each call ending in a device synchronize so the clock sees the
kernels, not their launch. Ratios are to causal SDPA (attention), a same-bytes copy (RoPE) or `none` (models).
Written without a GPU at hand: its --quick mode runs these code paths on the CPU at toy sizes."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.timing import interleaved_seconds, ratio
from posenc.models import GPT, GPTConfig
from posenc.nn.attention_core import attend
from posenc.nn.bias_paths import biased_attention, weights_attention
from posenc.registry import build
from posenc.scheme import Dims, materialises_bias

MATERIALISED_MAX_T = 8192  # the (1, H, T, T) bias past this is tens of GiB: the peer is left out


def synced(fn: Callable[[], object], device: torch.device) -> Callable[[], object]:
    def call():
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out

    return call


def _forward_backward(fn: Callable[[], torch.Tensor], inputs: list[torch.Tensor]) -> Callable[[], object]:
    def call():
        out = fn()
        grads = torch.autograd.grad(out, inputs, torch.ones_like(out), allow_unused=True)
        return grads

    return call


def _flex(q, k, v, scheme, pos):
    """flex_attention with the scheme's score_mod and a causal block mask, compiled (the peer)."""
    from torch.nn.attention.flex_attention import create_block_mask

    compiled = _compiled_flex()
    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, q.shape[-2], k.shape[-2], device=q.device)
    score_mod = scheme.score_mod(pos, pos)
    return lambda: compiled(q, k, v, score_mod=score_mod, block_mask=mask)


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def attention_contenders(name: str, t: int, heads: int, head_dim: int, device, dtype, backward: bool) -> dict:
    """posenc's path for the scheme, and its peers (flex with the score_mod, the materialised bias)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, t, head_dim, generator=g).to(device, dtype).requires_grad_(backward)
               for _ in range(3))
    scheme = build(name, Dims(d_model=heads * head_dim, n_head=heads, head_dim=head_dim, max_seq_len=t)).to(device)
    pos = torch.arange(t, device=device)[None]
    if scheme.needs_weights:
        ours = lambda: weights_attention(q, k, v, scheme, pos, pos, True)
    elif materialises_bias(scheme):
        ours = lambda: biased_attention(q, k, v, scheme, pos, pos, True)
    else:
        ours = lambda: attend(q, k, v, None, True)
    contenders = {f"posenc {name}": ours}
    if not backward and device.type == "cuda" and scheme.score_mod(pos, pos) is not None:  # CPU flex: see bias_paths
        contenders[f"flex {name}"] = _flex(q, k, v, scheme, pos)
    if materialises_bias(scheme) and not scheme.needs_weights and t <= MATERIALISED_MAX_T:
        contenders[f"materialised {name}"] = lambda: attend(q, k, v, scheme.bias(pos, pos, q, k), True)
    if backward:
        inputs = [q, k, v, *(p for p in scheme.parameters() if p.requires_grad)]
        contenders = {n: _forward_backward(fn, inputs) for n, fn in contenders.items()}
    return contenders


def attention_rows(schemes: list[str], lengths: list[int], heads: int, head_dim: int, repeats: int, device,
                   dtype) -> list[dict]:
    rows = []
    for backward in (False, True):
        for t in lengths:
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(1, heads, t, head_dim, generator=g).to(device, dtype).requires_grad_(backward)
                       for _ in range(3))
            sdpa = lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
            calls = {"causal SDPA": _forward_backward(sdpa, [q, k, v]) if backward else sdpa}
            for name in schemes:
                calls.update(attention_contenders(name, t, heads, head_dim, device, dtype, backward))
            seconds = interleaved_seconds({n: synced(fn, device) for n, fn in calls.items()}, repeats)
            rows += [{"pass": "fwd+bwd" if backward else "fwd", "T": t, "path": n, "ms": 1e3 * s,
                      "x SDPA": ratio(s, seconds["causal SDPA"])} for n, s in seconds.items()]
    return rows


def _rope_peers(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> dict:
    """transformers' rotate_half formula and Liger's Triton kernel, where installed."""
    peers = {}
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        full_cos, full_sin = (torch.cat((c, c), -1)[:, 0].to(x.dtype) for c in (cos, sin))  # (1,T,Dh): unsqueezed at 1
        peers["transformers rotate_half"] = lambda: apply_rotary_pos_emb(x, x, full_cos, full_sin)[0]
    except ImportError:
        pass
    try:
        from liger_kernel.ops.rope import LigerRopeFunction

        full_cos, full_sin = (torch.cat((c, c), -1)[:, 0].to(x.dtype) for c in (cos, sin))  # (1,T,Dh)
        peers["Liger rope"] = lambda: LigerRopeFunction.apply(x, x, full_cos, full_sin)[0]
    except ImportError:
        pass
    return peers


def rope_rows(shapes: list[tuple[int, int, int, int]], repeats: int, device, dtype) -> list[dict]:
    """Half-split and interleaved RoPE, forward and forward+backward, against a same-bytes copy."""
    from posenc.rotary._core import apply_rotary, cos_sin, inv_frequencies

    rows = []
    for b, h, t, d in shapes:
        x = torch.randn(b, h, t, d, device=device, dtype=dtype)
        cos, sin = (c.to(device) for c in cos_sin(torch.arange(t)[None], inv_frequencies(d, 10000.0)))
        out = torch.empty_like(x)
        for backward in (False, True):
            xg = x.detach().requires_grad_(backward)
            calls = {"copy": lambda out=out, x=x: out.copy_(x)}  # called within this iteration only
            calls |= {f"posenc {p}": (lambda i=(p == "interleaved"), xg=xg, c=cos, s=sin: apply_rotary(xg, c, s, i))
                      for p in ("half-split", "interleaved")}
            calls |= _rope_peers(xg, cos, sin)
            if backward:
                calls = {n: (fn if n == "copy" else _forward_backward(fn, [xg])) for n, fn in calls.items()}
            seconds = interleaved_seconds({n: synced(fn, x.device) for n, fn in calls.items()}, repeats)
            copy = seconds["copy"] * (2 if backward else 1)  # fwd+bwd moves the bytes twice
            rows += [{"pass": "fwd+bwd" if backward else "fwd", "B,H,T,Dh": f"{b},{h},{t},{d}", "path": n,
                      "us": 1e6 * s, "x copy": ratio(s, copy)} for n, s in seconds.items()]
    return rows


def _gpt(name: str, layers: int, d_model: int, heads: int, seq: int, device) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=50304, n_layer=layers, n_head=heads, d_model=d_model, max_seq_len=seq,
                    position_embedding_type=name)
    return GPT(cfg).to(device)


def train_rows(schemes: list[str], layers: int, d_model: int, heads: int, seq: int, batch: int, repeats: int,
               device, dtype) -> list[dict]:
    """One AdamW step of a GPT (GPT-2 small: 12 x 768, 12 heads at T = 1024) under autocast: tokens/s."""
    steps = {}
    for name in schemes:
        model = _gpt(name, layers, d_model, heads, seq, device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
        data = torch.randint(0, 50304, (batch, seq + 1), device=device)

        def step(model=model, opt=opt, data=data):
            with torch.autocast(device.type, dtype=dtype):
                loss = F.cross_entropy(model(data[:, :-1]).flatten(0, 1).float(), data[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        steps[name] = synced(step, device)
    seconds = interleaved_seconds(steps, repeats)
    return [{"scheme": n, "ms/step": 1e3 * s, "tokens/s": batch * seq / s, "x none": ratio(seconds["none"], s)}
            for n, s in seconds.items()]


def decode_rows(schemes: list[str], context: int, layers: int, d_model: int, heads: int, repeats: int, device,
                dtype) -> list[dict]:
    """One token against a cache of `context` tokens, per scheme: ms per step, ratio to `none`."""
    steps = {}
    for name in schemes:
        model = _gpt(name, layers, d_model, heads, context + repeats + 16, device).eval().to(dtype)
        cache = model.new_cache()
        with torch.no_grad():
            for start in range(0, context, 1024):  # chunked prefill
                model(torch.randint(0, 50304, (1, min(1024, context - start)), device=device), cache=cache)
        token = torch.zeros(1, 1, dtype=torch.long, device=device)

        def step(model=model, cache=cache, token=token):
            with torch.no_grad():
                return model(token, cache=cache)

        steps[name] = synced(step, device)
    seconds = interleaved_seconds(steps, repeats, warmup=1)
    return [{"context": context, "scheme": n, "ms/token": 1e3 * s, "x none": ratio(s, seconds["none"])}
            for n, s in seconds.items()]


__all__ = ["attention_rows", "decode_rows", "rope_rows", "synced", "train_rows"]
