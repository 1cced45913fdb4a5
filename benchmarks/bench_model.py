"""Whole-model costs per scheme vs `none`, every scheme measured in the same rounds (timing.interleaved_seconds):
a training step (forward, backward, AdamW), an inference forward with its peak memory, and a decode step."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.memory import peak_live_bytes
from benchmarks.timing import interleaved_seconds, ratio
from posenc.models import GPT, GPTConfig

PREFILL_CHUNK = 1024


def _model(name: str, seq: int, d_model: int, layers: int, heads: int) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=256, n_layer=layers, n_head=heads, d_model=d_model, max_seq_len=max(seq, 16384),
                         position_embedding_type=name))


def _train_step(name: str, seq: int, batch: int, d_model: int, layers: int, heads: int):
    model = _model(name, seq, d_model, layers, heads).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randint(0, 256, (batch, seq + 1), generator=torch.Generator().manual_seed(0))

    def step():
        loss = F.cross_entropy(model(data[:, :-1]).flatten(0, 1), data[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def train_rows(schemes: list[str], shapes: list[tuple[int, int]], repeats: int, d_model=128, layers=4,
               heads=4) -> list[dict]:
    """One AdamW step per (T, B) shape; ms/step and the ratio to `none` (the first scheme)."""
    rows = []
    for seq, batch in shapes:
        steps = {name: _train_step(name, seq, batch, d_model, layers, heads) for name in schemes}
        seconds = interleaved_seconds(steps, repeats)
        rows += [{"T": seq, "B": batch, "scheme": name, "ms/step": 1e3 * s, "x none": ratio(s, seconds["none"])}
                 for name, s in seconds.items()]
    return rows


def forward_rows(schemes: list[str], lengths: list[int], repeats: int, d_model=256, layers=2,
                 heads=8) -> list[dict]:
    """One inference forward of a (1, T) batch: ms, ratio to `none`, and peak live tensor bytes."""
    rows = []
    for seq in lengths:
        tokens = torch.randint(0, 256, (1, seq), generator=torch.Generator().manual_seed(0))
        models = {name: _model(name, seq, d_model, layers, heads).eval() for name in schemes}
        calls = {name: (lambda m=m, tokens=tokens: m(tokens)) for name, m in models.items()}
        with torch.no_grad():
            seconds = interleaved_seconds(calls, repeats, warmup=1)
            memory = {name: peak_live_bytes(call) for name, call in calls.items()}
        rows += [{"T": seq, "scheme": name, "ms": 1e3 * s, "x none": ratio(s, seconds["none"]),
                  "peak MiB": memory[name] / 2**20, "x none mem": ratio(memory[name], memory["none"])}
                 for name, s in seconds.items()]
    return rows


def _decoder(name: str, ctx: int, new_tokens: int, d_model: int, layers: int, heads: int):
    """A model with `ctx` tokens in its cache; each call decodes one more token (the cache grows by one)."""
    model = _model(name, ctx + new_tokens + 8, d_model, layers, heads).eval()
    prompt = torch.randint(0, 256, (1, ctx), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache()
    with torch.no_grad():
        for start in range(0, ctx, PREFILL_CHUNK):  # chunked prefill: score memory ~ chunk x ctx
            logits = model(prompt[:, start : start + PREFILL_CHUNK], cache=cache)
    state = {"token": logits[:, -1:].argmax(-1)}

    def step():
        with torch.no_grad():
            state["token"] = model(state["token"], cache=cache)[:, -1:].argmax(-1)

    return step


def decode_rows(schemes: list[str], contexts: list[int], new_tokens: int, d_model=256, layers=4,
                heads=8) -> list[dict]:
    """Median latency of one new token against a cache of `context` tokens, ratio to `none`."""
    rows = []
    for ctx in contexts:
        steps = {name: _decoder(name, ctx, new_tokens + 2, d_model, layers, heads) for name in schemes}
        seconds = interleaved_seconds(steps, new_tokens, warmup=2)
        rows += [{"context": ctx, "scheme": name, "ms/token": 1e3 * s, "x none": ratio(s, seconds["none"])}
                 for name, s in seconds.items()]
    return rows
