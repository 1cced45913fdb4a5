"""Where does a task model go wrong past its training sizes? Trains one model as `posenc tasks`
does and prints, for problems of one size, the answer index of the first wrong token and what
was emitted there.

    .venv/bin/python scripts/first_error.py --scheme rope --task copy --size 6
"""

from __future__ import annotations

import argparse
import random
from collections import Counter

from posenc.data.tasks import TASKS, decode, get_task, make_problems
from posenc.experiments.config.sections import TaskOptim
from posenc.experiments.tasks.entries import contender_config
from posenc.experiments.training.task_model import longest_sequence, train_on_task
from posenc.models import GPTConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--scheme", default="rope", help="a leaderboard entry: scheme name, optionally +randomized")
    add("--task", default="copy", choices=sorted(TASKS))
    add("--size", type=int, default=6, help="problem size to probe")
    add("--train-len", type=int, default=5)
    add("--steps", type=int, default=1500)
    add("--seed", type=int, default=0)
    add("--problems", type=int, default=256)
    args = parser.parse_args()
    task = get_task(args.task, field="--task")
    # The `posenc tasks` defaults: 2 layers, d_model 128, max_seq_len for 4x the training sizes.
    longest = max(longest_sequence(t, 4 * args.train_len) for t in TASKS.values())
    base = GPTConfig(n_layer=2, n_head=4, d_model=128, max_seq_len=longest, position_embedding_type="none",
                     abacus_max_offset=4 * args.train_len)
    model = train_on_task(contender_config(base, args.scheme, field="--scheme"), task, args.train_len,
                          TaskOptim(max_steps=args.steps), args.seed)
    prompts, answers = make_problems(task, args.size, args.problems, random.Random(args.seed + 1))  # (B,P), (B,A)
    out = model.generate(prompts, answers.shape[1], use_cache=True)[:, prompts.shape[1]:]  # (B,A)
    wrong = out != answers
    first = [int(row.float().argmax()) if row.any() else None for row in wrong]
    print(f"{args.scheme} on {args.task}, trained on sizes 1..{args.train_len}, {args.problems} problems of size "
          f"{args.size}: {first.count(None)} right")
    print("first wrong answer index -> problems:", sorted(Counter(i for i in first if i is not None).items()))
    emitted = Counter(decode([int(out[b, i])]) for b, i in enumerate(first) if i is not None)
    print("emitted there (most common):", emitted.most_common(5))


if __name__ == "__main__":
    main()
