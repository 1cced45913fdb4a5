"""DDP set-up under torchrun: a process group when WORLD_SIZE > 1 (gloo on CPU, nccl on GPU)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist


@contextlib.contextmanager
def distributed() -> Iterator[int]:
    """Yields this process's rank; a single process yields 0 and sets nothing up."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        yield 0
        return
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        yield dist.get_rank()
    finally:
        dist.barrier()
        dist.destroy_process_group()
