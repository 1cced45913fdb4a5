"""DDP set-up under torchrun: a process group when WORLD_SIZE > 1 (gloo for a CPU run, nccl for a GPU run)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist


@contextlib.contextmanager
def distributed(device: torch.device | str = "cpu") -> Iterator[int]:
    """Yields this process's rank; a single process yields 0 and sets nothing up. The backend follows the
    run's device (trainer.device), not what the machine has: a CPU run on a GPU machine needs gloo."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        yield 0
        return
    dist.init_process_group("nccl" if torch.device(device).type == "cuda" else "gloo")
    try:
        yield dist.get_rank()
    finally:
        dist.barrier()
        dist.destroy_process_group()
