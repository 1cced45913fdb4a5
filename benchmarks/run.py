"""One benchmark run: training steps, inference forwards, attention with biases, cached decoding (plain and under a
position map), RoPE vs peers.

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 python -m benchmarks.run
    (or `make bench`, `posenc bench`); --quick for a smoke run; --isa avx2 emulates an AVX2 machine on an AVX-512
    one. Writes benchmarks/results-cpu-<isa>.json, then BENCHMARKS.md from every such file (a section per ISA).
Ratios are measured side by side in this one run (medians of interleaved rounds, warm-up excluded).
--baseline RESULTS.json adds a "was" value to every ratio from an earlier run of this harness, e.g. on the
commit before a change (the harness only uses APIs that commit has):
    git worktree add /tmp/before <commit> && cp -r benchmarks /tmp/before/ && cd /tmp/before && \
        MALLOC_...=... <repo>/.venv/bin/python -m benchmarks.run --out /tmp/before   # imports /tmp/before/posenc
    cd <repo> && make bench BASELINE=/tmp/before/benchmarks/results-cpu-avx512.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmarks.bench_attention import attention_rows
from benchmarks.bench_model import decode_rows, forward_rows, map_decode_rows, static_decode_rows, train_rows
from benchmarks.bench_rope import rope_rows
from benchmarks.machine import cpu_flags, describe, emulating_avx2, emulation_env
from benchmarks.report import markdown
from posenc.models.static_decode import served_schemes

ALL_SCHEMES = ["none", "learned_absolute", "sinusoidal", "rope", "xpos", "p_rope", "alibi", "kerple", "sandwich",
               "relative", "fire", "shaw", "transformer_xl", "cope"]
# Schemes whose positional term is (Tq, Tk)-sized by nature (CoPE's gates, Transformer-XL's per-query rows over
# every distance) are left out of the long inference forwards: at 8192 tokens that is 2 GiB per layer.
FORWARD_SCHEMES = ["none", "rope", "alibi", "kerple", "sandwich", "relative", "fire", "shaw"]
MAPS = ["self_extend", "dual_chunk", "lm_infinite", "attention_sinks", "string"]


def plan(quick: bool) -> dict:
    if quick:
        return {"train": ["none", "rope", "alibi"], "train_shapes": [(32, 2)], "train_repeats": 2,
                "forward": ["none", "alibi"], "forward_lengths": [128], "forward_repeats": 2,
                "attention_lengths": [256], "attention_repeats": 2, "decode": ["none", "rope", "alibi"],
                "contexts": [64], "new_tokens": 3, "maps": ["self_extend"], "rope": [(1, 8, 256, 64)],
                "rope_repeats": 2, "static_decode": ["none", "alibi"]}
    return {"train": ALL_SCHEMES, "train_shapes": [(64, 32), (256, 8), (1024, 2), (2048, 1)], "train_repeats": 7,
            "forward": FORWARD_SCHEMES, "forward_lengths": [2048, 4096, 8192], "forward_repeats": 3,
            "attention_lengths": [2048, 4096, 8192], "attention_repeats": 3, "decode": ALL_SCHEMES,
            "contexts": [4096], "new_tokens": 200, "maps": MAPS,
            "rope": [(1, 8, 512, 64), (1, 16, 2048, 64), (4, 32, 4096, 128), (2, 8, 8192, 64)], "rope_repeats": 5,
            "static_decode": [name for name in ALL_SCHEMES if name in served_schemes()]}


SECTIONS = ("train", "forward", "attention", "decode", "map_decode", "rope", "static_decode")


def _kept_sections(path: Path, running: set[str]) -> dict:
    """The sections of an earlier results file that this run does not run again (a run of some sections updates
    theirs and keeps the rest, each with the date of its own run)."""
    if not path.exists():
        return {}
    earlier = json.loads(path.read_text())
    return {key: earlier[key] for key in (*SECTIONS, "runs") if key in earlier and key not in running}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--device" or a.startswith("--device=") for a in argv):  # the GPU harness: benchmarks/gpu.py
        from benchmarks.gpu import main as gpu_main

        return gpu_main(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the harness, measures nothing")
    parser.add_argument("--out", default=".", help="folder for BENCHMARKS.md (results go to benchmarks/)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help="the sections to run; the others keep their rows from this ISA's last results file")
    parser.add_argument("--baseline", help="results-cpu-<isa>.json of an earlier run: its ratios are shown as 'was'")
    parser.add_argument("--baseline-label", default="the commit before issue 15's fast paths")
    parser.add_argument("--isa", choices=("native", "avx2"), default="native",
                        help="avx2: on an AVX-512 machine, emulate an AVX2 one (benchmarks/machine.py)")
    args = parser.parse_args(argv)
    if args.isa == "avx2" and "avx512f" not in cpu_flags():
        print("this machine has no AVX-512: the plain run measures AVX2 itself (results-cpu-avx2.json)")
        return 0
    if args.isa == "avx2" and not emulating_avx2():
        # torch and MKL read these when they load: run the harness again in a process that starts with them.
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.run", *argv], {**os.environ, **emulation_env()})
    p, sections = plan(args.quick), set(args.sections.split(","))
    if unknown := sections - set(SECTIONS):
        parser.error(f"--sections: unknown {sorted(unknown)}; allowed: {', '.join(SECTIONS)}")
    out = Path(args.out)
    prefix = f"results-{'quick-' if args.quick else ''}cpu-"  # one file per ISA; BENCHMARKS.md shows them all
    json_path = out / "benchmarks" / f"{prefix}{describe()['isa']}.json"
    started = time.perf_counter()
    results = {**_kept_sections(json_path, sections), "machine": describe(), "quick": args.quick}
    results["runs"] = {**results.get("runs", {}), **dict.fromkeys(sections, time.strftime("%Y-%m-%d"))}
    if "train" in sections:
        results["train"] = train_rows(p["train"], p["train_shapes"], p["train_repeats"])
    if "forward" in sections:
        results["forward"] = forward_rows(p["forward"], p["forward_lengths"], p["forward_repeats"])
    if "attention" in sections:
        results["attention"] = attention_rows(p["attention_lengths"], 8, 64, p["attention_repeats"])
    if "decode" in sections:
        results["decode"] = decode_rows(p["decode"], p["contexts"], p["new_tokens"])
    if "map_decode" in sections:
        results["map_decode"] = map_decode_rows(p["maps"], p["contexts"], p["new_tokens"])
    if "rope" in sections:
        results["rope"] = rope_rows(p["rope"], p["rope_repeats"])
    if "static_decode" in sections:
        results["static_decode"] = static_decode_rows(p["static_decode"], p["contexts"], p["new_tokens"])
    results["seconds"] = time.perf_counter() - started
    baseline = None
    if args.baseline:
        baseline = {**json.loads(Path(args.baseline).read_text()), "label": args.baseline_label}
    (out / "benchmarks").mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2))
    by_isa = {path.stem.removeprefix(prefix): json.loads(path.read_text())
              for path in sorted((out / "benchmarks").glob(f"{prefix}*.json"))}
    md_path = out / ("BENCHMARKS-quick.md" if args.quick else "BENCHMARKS.md")
    md_path.write_text(markdown(by_isa, {results["machine"]["isa"]: baseline} if baseline else {}))
    print(md_path.read_text())
    print(f"wrote {md_path} and {json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
