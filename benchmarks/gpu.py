"""The GPU benchmark: `python -m benchmarks.gpu` from a checkout (no install), or `posenc bench --device cuda`.

    attention   forward and forward+backward, bf16, head dims 64 and 128, MHA and GQA 4:1: posenc's path per
                scheme, flex_attention with the scheme's score_mod and the materialised bias as peers, all as
                ratios to causal SDPA pinned to FlashAttention-2 (named in the table)
    rope        half-split and interleaved against a same-bytes copy, transformers' rotate_half, Liger's kernel
    decode      one token against a 16k cache, per scheme, ratio to `none`
    train       one AdamW step of a GPT-2-small-sized model (12 layers, d_model 768, 12 heads, T = 1024), tokens/s
    graphs      the decode step three ways at 4k and 32k cached tokens: ordinary eager, static eager, static replayed
                from a CUDA graph (benchmarks/gpu_decode_graphs.py), a SmolLM2-shaped Llama decoder plain and under
                each position map (graphed, as a ratio to the plain one's graphed step), GPT with none, rope, alibi,
                fire; not in the default sections (scripts/gpu_schemes.sh runs it)
    maps        each position map (Self-Extend, DCA, LM-Infinite, sinks, STRING) at 4x the trained length: a 32k
                prompt's attention (Dh 128, GQA 32:8) and a decode step against a 32k cache, as ratios to plain RoPE

Every row is appended to <out>/benchmarks/results-gpu.jsonl the moment it is measured (an OOM or a crash loses
nothing measured before it); BENCHMARKS-gpu.md's measured section is written from those rows at the end.
--quick runs every code path at toy sizes, on the CPU too (--device cpu), and measures nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks import gpu_decode_graphs, gpu_sections, gpu_targets
from benchmarks.report import table
from benchmarks.sections import replace_section

ATTENTION = ["alibi", "kerple", "sandwich", "relative", "fire", "shaw", "transformer_xl", "cope"]
MODELS = ["none", "learned_absolute", "sinusoidal", "rope", "xpos", "alibi", "kerple", "sandwich", "relative", "fire",
          "shaw", "transformer_xl", "cope"]
# Targets (issue 33 for the row schemes, 21 for the rest): attention fwd / fwd+bwd to causal SDPA, models'
# tokens/s to `none`.
ATTENTION_TARGETS = {"alibi": (1.10, 1.20), "sandwich": (1.10, 1.20), "kerple": (1.10, 1.20),
                     "relative": (1.10, 1.20), "fire": (1.30, 1.40), "shaw": (1.6, 1.6),
                     "transformer_xl": (1.6, 1.6), "cope": (2.0, 2.0)}
TRAIN_TARGETS = {**dict.fromkeys(["rope", "xpos", "learned_absolute", "sinusoidal"], 0.95),
                 **dict.fromkeys(["alibi", "kerple", "sandwich", "relative", "fire"], 0.90),
                 **dict.fromkeys(["shaw", "transformer_xl", "cope"], 0.75)}
ROPE_TARGET = 1.2
MAP_TARGET, MAP_DECODE_TARGET = gpu_targets.MAP_PROMPT, gpu_targets.MAP_DECODE  # issue 34


def plan(quick: bool) -> dict:
    if quick:
        return {"attention": ["alibi", "kerple"], "lengths": [64], "head_dims": [16], "kv_groups": [1, 2],
                "tokens": 64, "repeats": 1, "rope": [(1, 2, 32, 16)], "decode": ["none", "alibi"], "context": 32,
                "train": ["none", "rope", "alibi"], "model": (2, 64, 2, 32, 2), "maps": ["self_extend", "dual_chunk"],
                "map_lengths": [64], "map_heads": (16, 4, 2),
                "graph_contexts": [32, 64]}
    return {"attention": ATTENTION, "lengths": [1024, 4096, 16384], "head_dims": [64, 128], "kv_groups": [1, 4],
            "tokens": 16384, "repeats": 10, "rope": [(1, 32, 4096, 128), (4, 32, 4096, 128), (1, 8, 16384, 256)],
            "decode": MODELS, "context": 16384, "train": MODELS, "model": (12, 768, 12, 1024, 8),
            "maps": list(gpu_sections.MAP_SPECS), "map_lengths": [32768], "map_heads": (128, 32, 8),
            "graph_contexts": [4096, 32768]}


def _met(value, bound: float | None, higher_is_better: bool = False) -> str:
    if bound is None or not isinstance(value, float) or value != value:
        return ""
    return "yes" if (value >= bound if higher_is_better else value <= bound) else "**no**"


def markdown(results: dict) -> str:
    """The GPU's measured section: one table per measurement, each ratio beside its target."""
    attention = []
    for row in results.get("attention", []):
        ours = row["path"].startswith("posenc")
        bound = ATTENTION_TARGETS.get(row["path"].split(" ", 1)[-1], (None, None))[row["pass"] == "fwd+bwd"]
        attention.append({**row, "target": bound if ours and bound is not None else "",
                          "met": _met(row["x SDPA"], bound) if ours else ""})
    rope = [{**row, "met": _met(row["x copy"], ROPE_TARGET) if row["path"].startswith("posenc") else ""}
            for row in results.get("rope", [])]
    maps = [{**row, "target": MAP_TARGET if row["path"].startswith("posenc") else "",
             "met": _met(row["x rope"], MAP_TARGET) if row["path"].startswith("posenc") else ""}
            for row in results.get("maps", [])]
    map_decode = [{**row, "target": MAP_DECODE_TARGET if row["map"] != "rope" else "",
                   "met": _met(row["x rope"], MAP_DECODE_TARGET) if row["map"] != "rope" else ""}
                  for row in results.get("map decode", [])]
    train = [{**row, "target": TRAIN_TARGETS.get(row["scheme"], ""),
              "met": _met(row["x none"], TRAIN_TARGETS.get(row["scheme"]), higher_is_better=True)}
             for row in results.get("train", [])]
    parts = [f"## GPU: {results['device']}\n", f"torch {results['torch']}, triton {results['triton']}, "
             f"{results['dtype']}; each contender timed on its own with CUDA events (triton.testing.do_bench, "
             f"median), ratios within one process ({results.get('seconds', float('nan')):.0f} s).\n",
             "### Attention (ratio to causal SDPA)\n", table(attention),
             f"### RoPE (ratio to a same-bytes copy; target <= {ROPE_TARGET})\n", table(rope),
             "### Decode step\n", table(results.get("decode", [])),
             "### Position maps: a prompt at 4x the trained length (ratio to RoPE + causal SDPA)\n", table(maps),
             "### Position maps: a decode step at 4x the trained length (ratio to RoPE)\n", table(map_decode),
             "### Decode step captured whole: ordinary eager, static eager, static graphed (ms per token)\n",
             table(results.get("graphs", [])),
             "### Training step, GPT-2 small (tokens/s; ratio to `none`, higher is better)\n", table(train)]
    return "\n".join(parts)


def _csv(text: str, cast=str) -> list:
    return [cast(x) for x in text.split(",") if x]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="toy sizes: checks the harness, measures nothing")
    parser.add_argument("--device", default="cuda", help="cuda (or cuda:N); cpu only with --quick")
    parser.add_argument("--out", default=".", help="folder for BENCHMARKS-gpu.md and benchmarks/results-gpu.jsonl")
    parser.add_argument("--sections", default="attention,rope,decode,train,maps")
    parser.add_argument("--schemes", help="attention, decode and train schemes (default: each section's list)")
    parser.add_argument("--lengths", help="attention lengths, e.g. 1024,4096,16384")
    parser.add_argument("--head-dims", help="attention head dims, e.g. 64,128")
    parser.add_argument("--kv-groups", help="query heads per key head, e.g. 1,4 (4: GQA 4:1)")
    parser.add_argument("--map-lengths", help="maps: prompt lengths, each also the decode step's cache, e.g. "
                        "32768,65536 (issue 34's targets hold at 32k and 64k)")
    parser.add_argument("--graph-contexts", help="graphs: cache lengths, e.g. 4096,32768,65536")
    parser.add_argument("--graph-models", help="graphs: models by name prefix, e.g. smollm2 (the plain decoder and "
                        "each map; default: every model)")
    parser.add_argument("--no-peers", action="store_true",
                        help="attention against SDPA only: no flex or materialised peers (flex compiles per shape)")
    args = parser.parse_args(argv)
    unknown = set(_csv(args.sections)) - {"attention", "rope", "decode", "train", "maps", "graphs"}
    if unknown:
        parser.error(f"--sections {args.sections}: unknown {sorted(unknown)}; allowed: attention, rope, decode, train, "
                     "maps, graphs")
    if args.schemes:
        import posenc

        bad = sorted(set(_csv(args.schemes)) - set(posenc.available()))
        if bad:
            parser.error(f"--schemes: unknown {bad}; allowed: {', '.join(posenc.available())}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    if device.type != "cuda" and not args.quick:
        parser.error(f"--device {args.device}: the GPU benchmark measures CUDA; use --quick to check it elsewhere")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    device, dtype = torch.device(args.device), torch.bfloat16
    p = plan(args.quick)
    if args.schemes:
        p["attention"] = p["decode"] = p["train"] = _csv(args.schemes)
    p["lengths"] = _csv(args.lengths, int) if args.lengths else p["lengths"]
    p["head_dims"] = _csv(args.head_dims, int) if args.head_dims else p["head_dims"]
    p["kv_groups"] = _csv(args.kv_groups, int) if args.kv_groups else p["kv_groups"]
    p["map_lengths"] = _csv(args.map_lengths, int) if args.map_lengths else p["map_lengths"]
    p["graph_contexts"] = _csv(args.graph_contexts, int) if args.graph_contexts else p["graph_contexts"]
    suffix = "-gpu-quick" if args.quick else "-gpu"
    out = Path(args.out)
    (out / "benchmarks").mkdir(parents=True, exist_ok=True)
    rows_path = out / "benchmarks" / f"results{suffix}.jsonl"
    results = _environment(device, dtype, args.quick)
    rows_path.write_text(json.dumps({"section": "environment", **results}) + "\n")
    print(f"{results['device']}: torch {results['torch']}, triton {results['triton']}", flush=True)

    def sink(section: str, row: dict) -> None:
        results.setdefault(section, []).append(row)
        with rows_path.open("a") as f:
            f.write(json.dumps({"section": section, **row}) + "\n")
        print(section, " ".join(f"{k}={_short(v)}" for k, v in row.items()), flush=True)

    started = time.perf_counter()
    sections = set(_csv(args.sections))
    layers, d_model, heads, seq, batch = p["model"]
    runs = {
        "attention": lambda: gpu_sections.attention_rows(p["attention"], p["lengths"], p["head_dims"], p["kv_groups"],
                                                         p["tokens"], p["repeats"], device, dtype, sink,
                                                         peers=not args.no_peers),
        "rope": lambda: gpu_sections.rope_rows(p["rope"], p["repeats"], device, dtype, sink),
        "decode": lambda: gpu_sections.decode_rows(p["decode"], p["context"], layers, d_model, heads, p["repeats"],
                                                   device, dtype, sink),
        "train": lambda: gpu_sections.train_rows(p["train"], layers, d_model, heads, seq, batch, p["repeats"],
                                                 device, dtype, sink),
        "maps": lambda: _maps(p, layers, device, dtype, sink),
        "graphs": lambda: gpu_decode_graphs.graph_rows(p["graph_contexts"], layers, d_model, heads, device, dtype, sink,
                                                       quick=args.quick, names=_csv(args.graph_models or "") or None),
    }
    for name, run in runs.items():
        if name in sections:
            try:
                run()
            except Exception as err:  # a section that dies keeps what it measured; the next one runs
                sink("errors", {"section": name, "error": f"{type(err).__name__}: {err}"[:300]})
    results["seconds"] = time.perf_counter() - started
    md_path = out / f"BENCHMARKS{suffix}.md"
    replace_section(md_path, "measured", markdown(results))  # the static section (gpu_static.py) stays
    print(markdown(results))
    print(f"wrote {md_path} and {rows_path}")
    return 0


def _maps(p: dict, layers: int, device, dtype, sink) -> None:
    """The position maps' prefill attention and decode step, each against plain RoPE."""
    head_dim, heads, kv_heads = p["map_heads"]
    for length in p["map_lengths"]:  # the prompt's and the decode step's cache, shortest first
        gpu_sections.map_rows(p["maps"], length, head_dim, heads, kv_heads, p["repeats"], device, dtype, sink)
        gpu_sections.map_decode_rows(p["maps"], length, layers, heads * head_dim // 4, heads // 4, p["repeats"],
                                     device, dtype, sink)


def _short(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _environment(device: torch.device, dtype: torch.dtype, quick: bool) -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (quick check, not a measurement)"
    return {"device": name, "torch": torch.__version__, "triton": triton_version, "dtype": str(dtype), "quick": quick}


if __name__ == "__main__":
    raise SystemExit(main())
