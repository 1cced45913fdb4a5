"""Host syncs of the ordinary cached decode step (issue 34 item 4), counted, not timed: each is a point where a GPU's
host waits for every queued kernel (an int()/bool()/.item()/.tolist() of a device tensor, an output shape that
depends on values). Counted on the CPU by a dispatch mode (tests/models/host_syncs.py): the same operators run there.

Per model, float32 (the dtype whose CPU plan is the GPU's: rows_decode, pieces_decode), random weights, a 5-token
prompt then 12 greedy steps (past the Gemma-shaped decoder's window of 6), the 13th step counted:
  generate B=1, B=2   generate()'s step, model(token, position_ids, cache), one and two rows
  own loop B=1        a caller's step, model(token, cache=cache), positions from the cache
  generate's own      syncs of generate() outside the model's forward, over the whole call (the prompt's checks)

    .venv/bin/python -m benchmarks.decode_syncs [--where]     (--where: each sync's operator and posenc line)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import nn

from tests.models.host_syncs import generate_syncs, own_loop_step_syncs
from tests.models.static_support import VOCAB, gemma_like, gpt

PROMPT, STEPS = 5, 12
GPT_LAYERS = 4
GEMMA_LAYERS = ("sliding_attention",) * 5 + ("full_attention",)  # Gemma 3's pattern: five sliding, one full


def models() -> dict[str, Callable[[], nn.Module]]:
    def gemma3() -> nn.Module:
        return gemma_like(n_layer=len(GEMMA_LAYERS), layer_types=GEMMA_LAYERS)

    def smollm2() -> nn.Module:  # LlamaConfig's family: RMSNorm, GQA, one RoPE base, no window
        return gemma_like(family="llama", n_layer=4, layer_types=None, sliding_window=None, local_rotary_base=None,
                          hidden_act="silu", query_pre_attn_scalar=None, rotary_base=100000.0)

    gpts = {f"gpt {name} ({GPT_LAYERS} layers)": (lambda name=name: gpt(name, n_layer=GPT_LAYERS))
            for name in ("none", "rope", "alibi", "fire")}
    return {**gpts, f"gemma3-shaped ({len(GEMMA_LAYERS)} layers, 5 sliding)": gemma3,
            "smollm2-shaped (4 layers)": smollm2}


def prompt(batch: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, PROMPT), generator=torch.Generator().manual_seed(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--where", action="store_true", help="list each sync's operator and posenc line")
    where = parser.parse_args().where
    print(f"{'model':<40} {'generate B=1':>12} {'B=2':>5} {'own loop B=1':>13} {'generate own':>13}")
    for name, build in models().items():
        model = build().float()
        one_row, generate_own = generate_syncs(model, prompt(1), STEPS + 2)
        two_rows, _ = generate_syncs(model, prompt(2), STEPS + 2)
        own = own_loop_step_syncs(model, prompt(1), STEPS)
        counts = [sum(c.values()) for c in (one_row[-1], two_rows[-1], own, generate_own)]
        print(f"{name:<40} {counts[0]:>12} {counts[1]:>5} {counts[2]:>13} {counts[3]:>13}")
        if where:
            for label, counter in (("generate B=2", two_rows[-1]), ("own loop", own), ("generate own", generate_own)):
                for line, n in counter.most_common():
                    print(f"    {label}: {n} x {line}")


if __name__ == "__main__":
    main()
