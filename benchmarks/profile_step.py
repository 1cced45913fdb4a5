"""Where a training step of the demo's model goes (COMPARE.md's cost notes): ms per step on one thread, as each
of the demo's two worker processes runs it, and torch.profiler's top operators.

    .venv/bin/python -m benchmarks.profile_step --scheme alibi
    .venv/bin/python -m benchmarks.profile_step --scheme alibi --adamw fused --clip-foreach --gc-freeze --rows 0

The last three flags are the loop changes COMPARE.md reports as measured without a gain: compare their
ms/step against a plain run, alone on the machine, several times (the run-to-run noise is about 1 ms).
"""

from __future__ import annotations

import argparse
import gc
import time

import torch
from torch.profiler import ProfilerActivity, profile

from posenc.models import GPT, GPTConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scheme", default="alibi")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rows", type=int, default=10, help="operators to show (0: the time only)")
    parser.add_argument("--adamw", choices=("for-loop", "foreach", "fused"), default="for-loop",
                        help="AdamW's implementation (the training loop's: for-loop, torch's CPU default)")
    parser.add_argument("--clip-foreach", action="store_true", help="clip_grad_norm_(foreach=True)")
    parser.add_argument("--gc-freeze", action="store_true", help="gc.freeze() before the timed steps")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    # configs/compare.yaml's model and batch: 4 layers, d_model 64, 4 heads, 32 windows of 32 bytes.
    cfg = GPTConfig(vocab_size=256, n_layer=4, n_head=4, d_model=64, max_seq_len=256,
                    position_embedding_type=args.scheme)
    model = GPT(cfg)
    choice = {"for-loop": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[args.adamw]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, **choice)
    batch = torch.randint(0, 256, (args.batch_size, 33), generator=torch.Generator().manual_seed(0))

    def step() -> None:
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=args.clip_foreach or None)
        optimizer.step()

    for _ in range(10):
        step()
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    print(f"{args.scheme}: {1e3 * (time.perf_counter() - start) / args.steps:.2f} ms/step on one thread")
    if args.rows == 0:
        return 0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    mm = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::addmm", "aten::bmm"))
    print(f"matrix products (aten::mm/addmm/bmm): {100 * mm / total:.0f}% of the step's operator time")
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
