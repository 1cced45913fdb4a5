"""Whole-model costs per scheme vs `none`, every scheme measured in the same rounds (timing.interleaved_seconds):
a training step (forward, backward, AdamW), an inference forward with its peak memory, and a decode step."""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from benchmarks.memory import peak_live_bytes
from benchmarks.timing import interleaved_seconds, interleaved_times, ratio, ratio_spread
from posenc.models import GPT, GPTConfig

PREFILL_CHUNK = 1024


# The position maps of the map decode section, a rope GPT trained at a quarter of the cache (4x): Self-Extend's
# options scaled as the GPU benchmark's (benchmarks/gpu_sections.MAP_SPECS: G 8, W an eighth of the trained length),
# the others at their defaults from the trained length.
def map_specs(trained: int) -> dict[str, dict]:
    return {"self_extend": {"type": "self_extend", "group_size": 8, "window": trained // 8},
            "dual_chunk": {"type": "dual_chunk"}, "lm_infinite": {"type": "lm_infinite"},
            "attention_sinks": {"type": "attention_sinks"}, "string": {"type": "string"}}


def _model(name: str, seq: int, d_model: int, layers: int, heads: int, max_seq_len: int | None = None,
           attention_extension: dict | None = None) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=256, n_layer=layers, n_head=heads, d_model=d_model,
                         max_seq_len=max_seq_len or max(seq, 16384), position_embedding_type=name,
                         attention_extension=attention_extension))


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


def _prefilled(model: GPT, ctx: int) -> tuple[torch.Tensor, object, torch.Tensor]:
    """A fixed random prompt (1, ctx) prefilled into a new cache in chunks (score memory ~ chunk x ctx): (prompt,
    cache, the greedy next token (1,1))."""
    prompt = torch.randint(0, 256, (1, ctx), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache()
    with torch.no_grad():
        for start in range(0, ctx, PREFILL_CHUNK):
            logits = model(prompt[:, start : start + PREFILL_CHUNK], cache=cache)
    return prompt, cache, logits[:, -1:].argmax(-1)


def _decoder(name: str, ctx: int, new_tokens: int, d_model: int, layers: int, heads: int,
             max_seq_len: int | None = None, attention_extension: dict | None = None):
    """A model with `ctx` tokens in its cache; each call decodes one more token (the cache grows by one)."""
    model = _model(name, ctx + new_tokens + 8, d_model, layers, heads, max_seq_len, attention_extension).eval()
    _, cache, first = _prefilled(model, ctx)
    state = {"token": first}

    def step():
        with torch.no_grad():
            state["token"] = model(state["token"], cache=cache)[:, -1:].argmax(-1)

    return step


def _static_steps(name: str, ctx: int, new_tokens: int, d_model: int, layers: int, heads: int) -> dict:
    """Three decoders of one model continuing one prefilled cache: the ordinary step, the static step eager and the
    static step with its part (b) compiled (posenc.models.static_decode); each call decodes one more token. The
    compiled decoder's first step (the compile) is timed as 'compile s'."""
    from posenc.models.static_decode import StaticDecoder

    model = _model(name, ctx + new_tokens + 8, d_model, layers, heads).eval()
    prompt, cache, first = _prefilled(model, ctx)
    steps = {}
    for path, compiled in (("static", False), ("compiled", True)):
        decoder = StaticDecoder(model, 1, ctx + new_tokens + 4, cuda_graph=False, compiled=compiled)
        decoder.load(cache, prompt, torch.arange(ctx)[None])
        state = {"token": first}

        def step(decoder=decoder, state=state):
            state["token"] = decoder.step(state["token"]).argmax(-1, keepdim=True)
        steps[path] = step
    started = time.perf_counter()
    steps["compiled"]()
    compile_seconds = time.perf_counter() - started
    state = {"token": first}

    def ordinary():
        with torch.no_grad():
            state["token"] = model(state["token"], cache=cache)[:, -1:].argmax(-1)
    return {"ordinary": ordinary, **steps, "compile s": compile_seconds}


def static_decode_rows(schemes: list[str], contexts: list[int], new_tokens: int, d_model=256, layers=4,
                       heads=8) -> list[dict]:
    """The decode step captured whole on the CPU: per scheme the ordinary step, the static step eager and compiled
    (ms per token, medians of interleaved rounds), the compile's seconds, and the compiled step's per-token ratio
    to `none`'s compiled step (median, quartiles) and to the scheme's own ordinary step."""
    rows = []
    for ctx in contexts:
        built = {name: _static_steps(name, ctx, new_tokens + 4, d_model, layers, heads) for name in schemes}
        calls = {(name, path): fn for name, steps in built.items() for path, fn in steps.items() if path != "compile s"}
        times = interleaved_times(calls, new_tokens, warmup=2)
        for name, steps in built.items():
            middle, low, high = ratio_spread(times[(name, "compiled")], times[("none", "compiled")])
            ms = {path: 1e3 * statistics.median(times[(name, path)]) for path in ("ordinary", "static", "compiled")}
            rows.append({"context": ctx, "scheme": name, **{f"{path} ms": v for path, v in ms.items()},
                         "compile s": steps["compile s"], "x none": middle, "quartiles": f"{low:.2f}-{high:.2f}",
                         "x ordinary": ms["compiled"] / ms["ordinary"]})
    return rows


def decode_rows(schemes: list[str], contexts: list[int], new_tokens: int, d_model=256, layers=4,
                heads=8) -> list[dict]:
    """Median latency of one new token against a cache of `context` tokens, ratio to `none` (the median of the
    per-token ratios, with their quartiles)."""
    rows = []
    for ctx in contexts:
        steps = {name: _decoder(name, ctx, new_tokens + 2, d_model, layers, heads) for name in schemes}
        rows += _decode_ratios(interleaved_times(steps, new_tokens, warmup=2), "none",
                               {"context": ctx}, "scheme")
    return rows


def _decode_ratios(times: dict[str, list[float]], base: str, common: dict, label: str) -> list[dict]:
    """A row per function: its median ms per token, and its per-token ratio to `base` (median, quartiles)."""
    rows = []
    for name, t in times.items():
        middle, low, high = ratio_spread(t, times[base])
        rows.append({**common, label: name, "ms/token": 1e3 * statistics.median(t), f"x {base}": middle,
                     "quartiles": f"{low:.2f}-{high:.2f}"})
    return rows


def map_decode_rows(maps: list[str], contexts: list[int], new_tokens: int, d_model=256, layers=4,
                    heads=8) -> list[dict]:
    """Median latency of one new token against a cache of `context` tokens under each position map, ratio to plain
    RoPE's step, a rope GPT trained at context // 4."""
    rows = []
    for ctx in contexts:
        specs = {"rope": None, **{name: map_specs(ctx // 4)[name] for name in maps}}
        steps = {name: _decoder("rope", ctx, new_tokens + 2, d_model, layers, heads, ctx // 4, spec)
                 for name, spec in specs.items()}
        rows += _decode_ratios(interleaved_times(steps, new_tokens, warmup=2), "rope", {"context": ctx}, "map")
    return rows
