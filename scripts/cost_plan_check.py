"""The cost plan's estimate against the CPU seconds of the forwards an extend run measured (its progress.json, read
only), for runs without a position map. Compare CPU seconds, not wall time: on shared cores wall time is mostly
waiting; CPU seconds are inflated less (a thread pool's spinning still counts).
    .venv/bin/python scripts/cost_plan_check.py [--dense] MODEL RUN_DIR...
MODEL: a GGUF path or a built-in name (gemma3-270m, smollm2-135m); only its header is read. --dense: the run was made
before sliding layers attended block by block (their whole (Tq, Tk) mask), so estimate it that way. RULER prompts are
estimated without their decoded tokens (progress.json does not say how many): a lower bound."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from posenc.experiments.extend.forward_work import forward_work
from posenc.experiments.extend.long_context import estimated_cpu_seconds
from posenc.models.builtin import model_file
from posenc.models.families import family_of_gguf_arch
from posenc.models.gguf import _reader, metadata
from posenc.models.gguf_config import gguf_fields
from posenc.models.llama_config import LlamaConfig

SCORED_LAST = {"passkey", "ruler", "tune"}  # retrieval prompts score only their last position


def header_config(path: Path) -> LlamaConfig:
    reader = _reader(path)
    meta = metadata(reader)
    entry = family_of_gguf_arch(meta.get("general.architecture"))
    vocab = next(int(t.shape[-1]) for t in reader.tensors if t.name == "token_embd.weight")
    return LlamaConfig(**gguf_fields(meta, entry, vocab, {}))


def main(args: list[str]) -> None:
    dense = "--dense" in args
    model, *runs = [a for a in args if a != "--dense"]
    cfg = header_config(model_file(model))
    work = forward_work(cfg)
    print(f"{'run':<42} {'task':<8} {'length':>6} {'measured CPU s':>14} {'estimate':>9} {'ratio':>6}")
    for run in runs:
        for progress in sorted(Path(run).glob("**/progress.json")):
            state = json.loads(progress.read_text(encoding="utf-8"))
            chunk = json.loads((progress.parent / "run.json").read_text(encoding="utf-8"))["config"]["model"][
                "prefill_chunk"]
            for forward in state.get("forwards", []):
                length, task = forward["length"], forward["task"]
                scored = 1 if task in SCORED_LAST else length
                estimate = estimated_cpu_seconds(work, length, chunk, scored=scored, blocked=not dense)
                name = str(progress.parent.relative_to(progress.parent.parent.parent))
                print(f"{name:<42} {task:<8} {length:>6} {forward['cpu_seconds']:>14.0f} {estimate:>9.0f} "
                      f"{forward['cpu_seconds'] / estimate:>6.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
