"""The decode step three ways (issue 34 item 4), per model and cache length: the ordinary eager step (its cache grows,
its schemes read positions on the host), the static step run eagerly, and the static step replayed from a CUDA graph
(posenc.models.static_decode). Models: the SmolLM2-135M-shaped Llama decoder (LlamaConfig's defaults) with random
weights, plain and under each position map (gpu_sections.MAP_SPECS, defaults from its trained 8k: at 32k every map is
past its window; "x rope graphed": graphed ms over the plain one's, issue 34's <= 1.3 target), and GPT with none,
rope, alibi and fire (gpu.py's decode shape). `names` picks models by prefix (gpu.py --graph-models).

The caches are filled with random keys and values (a step's time does not depend on them; a 32k prefill per model
would cost more than the section's budget). Each contender runs WARMUP steps, then STEPS timed back to back with
CUDA events around the loop (ms per token = elapsed / STEPS); on the CPU (--quick) the host clock, and no graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from benchmarks.gpu_sections import MAP_SPECS
from posenc.models import GPT, GPTConfig
from posenc.models.llama import Llama
from posenc.models.llama_config import LlamaConfig
from posenc.models.static_decode import StaticDecoder

GPT_SCHEMES = ("none", "rope", "alibi", "fire")
PLAIN = "smollm2-shaped"  # the model each map's graphed step is compared with
WARMUP, STEPS = 5, 50
QUICK_STEPS = 2  # --quick: the code paths only
Sink = Callable[[str, dict], None]


def models(layers: int, d_model: int, heads: int, context: int, quick: bool) -> dict[str, Callable[[], nn.Module]]:
    """name -> a builder of the model (eval, on the CPU, float32)."""
    def gpt(name: str) -> nn.Module:
        return GPT(GPTConfig(vocab_size=50304, n_layer=layers, n_head=heads, d_model=d_model,
                             max_seq_len=context + 2 * (WARMUP + STEPS) + 64, position_embedding_type=name))

    def smollm2(spec: dict | None = None) -> nn.Module:  # SmolLM2-135M's shapes (30 x 576, 9 heads, GQA 3:1)
        small = dict(n_layer=2, d_model=64, n_head=4, n_kv_head=2, ffn_hidden_size=96, vocab_size=512) if quick else {}
        return Llama(LlamaConfig(**small, max_seq_len=8192, rotary_base=100000.0, attention_extension=spec))

    mapped = {f"{PLAIN} {name}": (lambda spec=spec: smollm2(spec)) for name, spec in MAP_SPECS.items()}
    return {PLAIN: smollm2, **mapped, **{f"gpt {name}": (lambda name=name: gpt(name)) for name in GPT_SCHEMES}}


def filled_cache(model: nn.Module, context: int, device, dtype):
    """An ordinary KVCache holding `context` random keys and values in every layer, and its tokens and positions."""
    cache = model.new_cache()
    ids = torch.zeros(1, context, dtype=torch.int64, device=device)
    positions = torch.arange(context, device=device)[None]
    cache.add_positions(positions)
    cache.add_tokens(ids)
    for i, block in enumerate(model.blocks):
        attn = block.attn
        shape = (1, attn.n_kv_head, context, attn.head_dim)
        cache.update(i, torch.randn(shape, device=device, dtype=dtype), torch.randn(shape, device=device, dtype=dtype))
    return cache, ids, positions


def loaded_decoder(make: Callable[[], nn.Module], context: int, device, dtype):
    """(model, its ordinary cache filled with `context` random keys, a StaticDecoder loaded from it, not graphed)."""
    with torch.device(device):  # built where it runs: a 135M model's init on the CPU costs seconds
        model = make().eval().to(dtype=dtype)
    cache, ids, positions = filled_cache(model, context, device, dtype)
    decoder = StaticDecoder(model, 1, context + 2 * (WARMUP + STEPS) + 8, cuda_graph=False)
    decoder.load(cache, ids, positions)
    return model, cache, decoder


def per_token(step: Callable[[], object], device, steps: int = STEPS) -> float:
    """Seconds per step over `steps` back-to-back steps after WARMUP (the graph's capture is in the warm-up)."""
    for _ in range(WARMUP):
        step()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(steps):
            step()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1e3 / steps
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - started) / steps


def _cell(fn: Callable[[], float]) -> float | str:
    try:
        return 1e3 * fn()
    except torch.OutOfMemoryError:
        return "OOM"
    except Exception as err:  # one contender's failure is a cell, not the end of the section
        return f"error: {type(err).__name__}: {str(err).strip().splitlines()[0][:80] if str(err).strip() else ''}"


@torch.no_grad()
def graph_rows(contexts: list[int], layers: int, d_model: int, heads: int, device, dtype, sink: Sink,
               quick: bool = False, names: list[str] | None = None) -> None:
    """Per model and cache length: ms per token of the ordinary eager step, the static step eagerly and graphed; a
    model under a map also as a ratio to the plain model's graphed step (measured first in the same run)."""
    steps = QUICK_STEPS if quick else STEPS
    for context in contexts:
        plain: float | str = "not measured"
        chosen = {name: make for name, make in models(layers, d_model, heads, context, quick).items()
                  if names is None or any(name.startswith(prefix) for prefix in names)}
        for name, make in chosen.items():
            try:
                model, cache, decoder = loaded_decoder(make, context, device, dtype)
            except torch.OutOfMemoryError:
                sink("graphs", {"context": context, "model": name, "eager ms": "OOM"})
                continue
            row = three_ways(model, cache, decoder, device, steps)
            if name == PLAIN:
                plain = row["graphed ms"]
            elif name.startswith(PLAIN):
                row["x rope graphed"] = _ratio(row["graphed ms"], plain)
            sink("graphs", {"context": context, "model": name, **row})
            del model, decoder, cache
            if device.type == "cuda":
                torch.cuda.empty_cache()


def three_ways(model: nn.Module, cache, decoder: StaticDecoder, device, steps: int) -> dict:
    """ms per token: the ordinary step on `cache`, then the decoder's step eagerly, then graphed (CUDA only)."""
    token = torch.zeros(1, 1, dtype=torch.int64, device=device)
    ordinary = _cell(lambda: per_token(lambda: model(token, cache=cache), device, steps))
    static = _cell(lambda: per_token(lambda: decoder.step(token), device, steps))
    graphed: float | str = "needs CUDA"
    if device.type == "cuda":
        decoder.graphed = True
        graphed = _cell(lambda: per_token(lambda: decoder.step(token), device, steps))
    return {"eager ms": ordinary, "static ms": static, "graphed ms": graphed, "x eager": _ratio(graphed, ordinary),
            "slots": slot_kernels(decoder)}


def slot_kernels(decoder: StaticDecoder) -> str:
    """The attention the map layers of the decoder's step ran (the dispatch's SLOT_RULES): slot_triton with its
    shares of the slots, slot_torch (map_slot_attention), or "-" for a model without a map."""
    import functools

    names = set()
    for layer in decoder._layers or ():
        attend = getattr(layer, "slots", None)
        if isinstance(attend, functools.partial):  # slot_triton: the plan bound to slots.attend
            names.add(f"slot_triton ({attend.args[0].shares} shares)")
        elif attend is not None:
            names.add("slot_torch")
    return ", ".join(sorted(names)) or "-"


def _ratio(value: float | str, base: float | str) -> float:
    return value / base if isinstance(value, float) and isinstance(base, float) and base else float("nan")


__all__ = ["graph_rows", "loaded_decoder", "models", "per_token", "three_ways"]
