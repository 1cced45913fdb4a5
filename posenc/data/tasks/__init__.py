"""Algorithmic length-generalisation tasks (Kazemnejad et al. 2023; Ruoss et al. 2023).

Train on problem sizes 1..L, test up to 4L: a scheme that generalises keeps its accuracy past L. The
split tasks (selective copy, counting, Flip-Flop; splits.py) train at one size and are tested on
distributions with more or fewer blanks, distractors or ignores (Golovneva et al. 2024).
`TASKS` is the only place a task name maps to code.
"""

from __future__ import annotations

from posenc.data.tasks.arithmetic import Addition, Parity, SumMod10
from posenc.data.tasks.base import BOS, END, SEP, Task, decode, encode
from posenc.data.tasks.batch import make_batch, make_problems
from posenc.data.tasks.counting import Counting
from posenc.data.tasks.flip_flop import FlipFlop
from posenc.data.tasks.selective_copy import SelectiveCopy
from posenc.data.tasks.sequence import Copy, Reverse, Sort
from posenc.data.tasks.splits import IN_DIST, SplitTask
from posenc.errors import unknown_name

TASKS: dict[str, Task] = {
    task.name: task for task in (Copy(), Reverse(), Addition(), Sort(), SumMod10(), Parity(),
                                 SelectiveCopy(), Counting(), FlipFlop())
}


def get_task(name: str, field: str = "task") -> Task:
    if name not in TASKS:
        raise unknown_name(field, name, TASKS)
    return TASKS[name]


__all__ = ["BOS", "END", "IN_DIST", "SEP", "TASKS", "SplitTask", "Task", "decode", "encode", "get_task",
           "make_batch", "make_problems"]
