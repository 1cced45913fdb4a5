"""Whole-model costs per scheme vs `none`: training tokens/s, and decode-step latency with the KV cache."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from benchmarks.timing import median_seconds, ratio
from posenc.models import GPT, GPTConfig

PREFILL_CHUNK = 1024


def _model(name: str, seq: int, d_model: int, layers: int, heads: int) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=256, n_layer=layers, n_head=heads, d_model=d_model, max_seq_len=max(seq, 16384),
                         position_embedding_type=name))


def train_rows(schemes: list[str], seq: int, batch: int, steps: int, d_model=256, layers=4, heads=8) -> list[dict]:
    rows, base = [], None
    data = torch.randint(0, 256, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    for name in schemes:
        model = _model(name, seq, d_model, layers, heads).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(model=model, opt=opt):
            loss = F.cross_entropy(model(data[:, :-1]).flatten(0, 1), data[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        seconds = median_seconds(step, repeats=steps, warmup=2)
        tps = batch * seq / seconds
        base = tps if name == "none" else base
        rows.append({"scheme": name, "tokens/s": tps, "x none": ratio(tps, base) if base else float("nan")})
    return rows


def decode_rows(schemes: list[str], contexts: list[int], new_tokens: int, d_model=256, layers=4,
                heads=8) -> list[dict]:
    rows = []
    for ctx in contexts:
        prompt = torch.randint(0, 256, (1, ctx), generator=torch.Generator().manual_seed(0))
        base = None
        for name in schemes:
            model = _model(name, ctx + new_tokens, d_model, layers, heads).eval()
            with torch.no_grad():
                cache = model.new_cache()
                for start in range(0, ctx, PREFILL_CHUNK):  # chunked prefill: score memory ~ chunk x ctx
                    logits = model(prompt[:, start : start + PREFILL_CHUNK], cache=cache)
                token = logits[:, -1:].argmax(-1)
                times = []
                for _ in range(new_tokens):
                    start = time.perf_counter()
                    token = model(token, cache=cache)[:, -1:].argmax(-1)
                    times.append(time.perf_counter() - start)
            ms = 1e3 * sorted(times)[len(times) // 2]
            base = ms if name == "none" else base
            rows.append({"context": ctx, "scheme": name, "ms/token": ms,
                         "x none": ratio(ms, base) if base else float("nan")})
    return rows
