"""CPU seconds per decoded token of SmolLM2-135M (the built-in GGUF, bfloat16 autocast) behind an N-token cache,
plain RoPE against Self-Extend (W=2048, G=3: the options at factor 2):
    .venv/bin/python scripts/decode_cost.py [threads] [N]      (default 1 thread, 8192 tokens)
Run it alone: CPU seconds of a thread pool on shared cores include spinning."""

import sys
import time

import torch

from posenc.experiments.extend.long_context import bfloat16_linears, inference
from posenc.models.gguf import builtin_smollm2_path
from posenc.models.llama import Llama

STEPS = 8


def main(threads: int, length: int) -> None:
    torch.set_num_threads(threads)
    model = bfloat16_linears(Llama.from_gguf(builtin_smollm2_path()))
    ids = torch.randint(100, 10000, (1, length), generator=torch.Generator().manual_seed(0))
    for spec in (None, {"type": "self_extend", "group_size": 3, "window": 2048}):
        model.set_attention_extension(spec)
        with inference("bfloat16"):
            cache = model.new_cache()
            cpu, wall = time.process_time(), time.perf_counter()
            model.features(ids, cache=cache)
            prefill = time.process_time() - cpu, time.perf_counter() - wall
            token = torch.tensor([[5]])
            model.features(token, cache=cache)  # warm-up
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(STEPS):
                model.features(token, cache=cache)
            per_token = (time.process_time() - cpu) / STEPS, (time.perf_counter() - wall) / STEPS
        name = spec["type"] if spec else "plain"
        print(f"{threads} thread(s), {length} tokens, {name}: prefill {prefill[0]:.1f} CPU s "
              f"({prefill[1]:.1f} s wall); decode {per_token[0]:.3f} CPU s per token ({per_token[1]:.3f} s wall)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1, int(sys.argv[2]) if len(sys.argv) > 2 else 8192)
