"""The GPU benchmark (issue 21): `posenc bench --device cuda` or `python -m benchmarks.gpu`.

    attention   forward and forward+backward, T = 1k..16k, bf16: posenc's path per scheme, flex_attention with the
                scheme's score_mod and the materialised (1, H, T, T) bias as peers, all as ratios to causal SDPA
    rope        half-split and interleaved against a same-bytes copy, transformers' rotate_half, Liger's kernel
    decode      one token against a 16k cache, per scheme, ratio to `none`
    train       one AdamW step of a GPT-2-small-sized model (12 layers, d_model 768, 12 heads, T = 1024), tokens/s

Writes BENCHMARKS-gpu.md and benchmarks/results-gpu.json (BENCHMARKS.md, the CPU sections, points to them).
--quick runs every code path at toy sizes, on the CPU too (--device cpu), and measures nothing.
Never run on a GPU yet when written (no device was lent to that session): the first run is its test.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks import gpu_sections
from benchmarks.report import table

ATTENTION = ["alibi", "kerple", "sandwich", "relative", "fire", "shaw", "transformer_xl", "cope"]
MODELS = ["none", "learned_absolute", "sinusoidal", "rope", "xpos", "alibi", "kerple", "sandwich", "relative", "fire",
          "shaw", "transformer_xl", "cope"]
# Targets of issue 21 (ratios; attention fwd / fwd+bwd to causal SDPA, models' tokens/s to `none`).
ATTENTION_TARGETS = {"alibi": (1.10, 1.20), "sandwich": (1.10, 1.20), "kerple": (1.10, 1.20),
                     "relative": (1.10, 1.20), "fire": (1.30, 1.40), "shaw": (1.6, 1.6),
                     "transformer_xl": (1.6, 1.6), "cope": (2.0, 2.0)}
TRAIN_TARGETS = {**dict.fromkeys(["rope", "xpos", "learned_absolute", "sinusoidal"], 0.95),
                 **dict.fromkeys(["alibi", "kerple", "sandwich", "relative", "fire"], 0.90),
                 **dict.fromkeys(["shaw", "transformer_xl", "cope"], 0.75)}


def plan(quick: bool) -> dict:
    if quick:
        return {"attention": ["alibi", "kerple"], "lengths": [64], "heads": 2, "head_dim": 16, "repeats": 1,
                "rope": [(1, 2, 32, 16)], "decode": ["none", "alibi"], "context": 32,
                "train": ["none", "rope", "alibi"], "model": (2, 64, 2, 32, 2)}
    return {"attention": ATTENTION, "lengths": [1024, 2048, 4096, 8192, 16384], "heads": 16, "head_dim": 64,
            "repeats": 10, "rope": [(1, 32, 4096, 128), (4, 32, 4096, 128), (1, 8, 16384, 256)],
            "decode": MODELS, "context": 16384, "train": MODELS, "model": (12, 768, 12, 1024, 8)}


def _met(value: float, bound: float | None, higher_is_better: bool = False) -> str:
    if bound is None or value != value:
        return ""
    return "yes" if (value >= bound if higher_is_better else value <= bound) else "**no**"


def markdown(results: dict) -> str:
    """The GPU section: one table per measurement, each ratio beside its target of issue 21."""
    attention = []
    for row in results.get("attention", []):
        name = row["path"].split(" ", 1)[-1]
        bound = ATTENTION_TARGETS.get(name, (None, None))[row["pass"] == "fwd+bwd"]
        attention.append({**row, "target": "" if bound is None or not row["path"].startswith("posenc") else bound,
                          "met": _met(row["x SDPA"], bound) if row["path"].startswith("posenc") else ""})
    rope = [{**row, "met": _met(row["x copy"], 1.2) if row["path"].startswith("posenc") else ""}
            for row in results.get("rope", [])]
    train = [{**row, "target": TRAIN_TARGETS.get(row["scheme"], ""),
              "met": _met(row["x none"], TRAIN_TARGETS.get(row["scheme"]), higher_is_better=True)}
             for row in results.get("train", [])]
    parts = [f"## GPU: {results['device']}\n", f"torch {results['torch']}, triton {results['triton']}, "
             f"{results['dtype']}; ratios measured side by side in one process ({results['seconds']:.0f} s).\n",
             "### Attention (ratio to causal SDPA)\n", table(attention), "### RoPE (ratio to a same-bytes copy)\n",
             table(rope), "### Decode step\n", table(results.get("decode", [])),
             "### Training step, GPT-2 small (tokens/s; ratio to `none`, higher is better)\n", table(train)]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="toy sizes: checks the harness, measures nothing")
    parser.add_argument("--device", default="cuda", help="cuda (or cuda:N); cpu only with --quick")
    parser.add_argument("--out", default=".", help="folder for BENCHMARKS-gpu.md (results go to benchmarks/)")
    parser.add_argument("--sections", default="attention,rope,decode,train")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    if device.type != "cuda" and not args.quick:
        parser.error(f"--device {args.device}: the GPU benchmark measures CUDA; use --quick to check it elsewhere")
    p, sections, dtype = plan(args.quick), set(args.sections.split(",")), torch.bfloat16
    started = time.perf_counter()
    results = _environment(device, dtype, args.quick)
    if "attention" in sections:
        results["attention"] = gpu_sections.attention_rows(p["attention"], p["lengths"], p["heads"], p["head_dim"],
                                                           p["repeats"], device, dtype)
    if "rope" in sections:
        results["rope"] = gpu_sections.rope_rows(p["rope"], p["repeats"], device, dtype)
    layers, d_model, heads, seq, batch = p["model"]
    if "decode" in sections:
        results["decode"] = gpu_sections.decode_rows(p["decode"], p["context"], layers, d_model, heads,
                                                     p["repeats"], device, dtype)
    if "train" in sections:
        results["train"] = gpu_sections.train_rows(p["train"], layers, d_model, heads, seq, batch, p["repeats"],
                                                   device, dtype)
    results["seconds"] = time.perf_counter() - started
    return _write(results, Path(args.out), args.quick)


def _environment(device: torch.device, dtype: torch.dtype, quick: bool) -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (quick check, not a measurement)"
    return {"device": name, "torch": torch.__version__, "triton": triton_version, "dtype": str(dtype), "quick": quick}


def _write(results: dict, out: Path, quick: bool) -> int:
    (out / "benchmarks").mkdir(parents=True, exist_ok=True)
    suffix = "-gpu-quick" if quick else "-gpu"
    json_path = out / "benchmarks" / f"results{suffix}.json"
    json_path.write_text(json.dumps(results, indent=2))
    md_path = out / f"BENCHMARKS{suffix}.md"
    md_path.write_text(markdown(results))
    print(md_path.read_text())
    print(f"wrote {md_path} and {json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
