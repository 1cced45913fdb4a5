"""One benchmark run: RoPE vs peers, attention with biases, training tokens/s, cached decoding.

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 python -m benchmarks.run
    (or `posenc bench`); --quick for a smoke run. Writes BENCHMARKS.md and benchmarks/results.json.
Ratios are measured side by side in this one run (median of repeats, warm-up excluded).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from benchmarks.bench_attention import attention_rows
from benchmarks.bench_model import decode_rows, train_rows
from benchmarks.bench_rope import rope_rows
from benchmarks.report import markdown

ALL_SCHEMES = ["none", "learned_absolute", "sinusoidal", "rope", "xpos", "p_rope", "alibi", "kerple", "sandwich",
               "relative", "fire", "shaw", "transformer_xl", "cope"]


def plan(quick: bool) -> dict:
    if quick:
        return {"rope": [(1, 8, 256, 64)], "lengths": [256], "repeats": 2, "train": ["none", "rope", "alibi"],
                "train_seq": 64, "steps": 2, "contexts": [128], "new_tokens": 3}
    return {"rope": [(1, 8, 512, 64), (1, 16, 2048, 64), (1, 16, 4096, 64), (4, 32, 4096, 128), (1, 16, 8192, 128),
                     (2, 8, 8192, 64)],
            "lengths": [512, 1024, 2048, 4096, 8192], "repeats": 5, "train": ALL_SCHEMES, "train_seq": 512,
            "steps": 5, "contexts": [512, 2048, 8192], "new_tokens": 12}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the harness, measures nothing")
    parser.add_argument("--out", default=".", help="folder for BENCHMARKS.md (results.json goes to benchmarks/)")
    parser.add_argument("--sections", default="rope,attention,train,decode")
    args = parser.parse_args(argv)
    p, sections = plan(args.quick), set(args.sections.split(","))
    started = time.perf_counter()
    results = {"machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
                          f"torch {torch.__version__}", "quick": args.quick}
    if "rope" in sections:
        results["rope"] = rope_rows(p["rope"], p["repeats"])
    if "attention" in sections:
        results["attention"] = attention_rows(p["lengths"], 8, 64, max(2, p["repeats"] - 2))
    if "train" in sections:
        results["train"] = train_rows(p["train"], p["train_seq"], 8, p["steps"])
    if "decode" in sections:
        results["decode"] = decode_rows(p["train"], p["contexts"], p["new_tokens"])
    results["seconds"] = time.perf_counter() - started
    out = Path(args.out)
    (out / "benchmarks").mkdir(parents=True, exist_ok=True)
    json_path = out / "benchmarks" / ("results-quick.json" if args.quick else "results.json")
    json_path.write_text(json.dumps(results, indent=2))
    md_path = out / ("BENCHMARKS-quick.md" if args.quick else "BENCHMARKS.md")
    md_path.write_text(markdown(results))
    print(md_path.read_text())
    print(f"wrote {md_path} and {json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
