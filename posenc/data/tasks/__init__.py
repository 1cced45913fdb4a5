"""Algorithmic length-generalisation tasks (Kazemnejad et al. 2023; Ruoss et al. 2023).

Train on problem sizes 1..L, test up to 4L: a scheme that generalises keeps its accuracy past L.
`TASKS` is the only place a task name maps to code.
"""

from __future__ import annotations

from posenc.data.tasks.arithmetic import Addition, Parity, SumMod10
from posenc.data.tasks.base import BOS, END, SEP, Task, decode, encode
from posenc.data.tasks.batch import make_batch, make_problems
from posenc.data.tasks.sequence import Copy, Reverse, Sort
from posenc.errors import unknown_name

TASKS: dict[str, Task] = {
    task.name: task for task in (Copy(), Reverse(), Addition(), Sort(), SumMod10(), Parity())
}


def get_task(name: str, field: str = "task") -> Task:
    if name not in TASKS:
        raise unknown_name(field, name, TASKS)
    return TASKS[name]


__all__ = ["BOS", "END", "SEP", "TASKS", "Task", "decode", "encode", "get_task", "make_batch", "make_problems"]
