"""Checkpoints: safetensors for tensors, JSON for the rest; written to a temp folder and renamed,
then a `latest` pointer swapped atomically. A crash at any moment leaves the previous good
checkpoint in place; a corrupt one is reported with its path."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model

from posenc.experiments.rundir import write_text


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated or corrupt."""


def _flatten_optimizer(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    state = opt.state_dict()
    tensors, plain = {}, {"param_groups": state["param_groups"], "state": {}}
    for pid, entry in state["state"].items():
        plain["state"][str(pid)] = {}
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{pid}.{key}"] = value.contiguous()
            else:
                plain["state"][str(pid)][key] = value
    return tensors, plain


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], plain: dict[str, Any]) -> dict[str, Any]:
    state = {int(pid): dict(entry) for pid, entry in plain["state"].items()}
    for name, value in tensors.items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    return {"state": state, "param_groups": plain["param_groups"]}


def save(run_dir: Path, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer,
         meta: dict[str, Any], keep: int = 2) -> Path:
    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=ckpt_root))
    final = ckpt_root / f"step-{step:08d}"
    try:
        save_model(model, str(tmp / "model.safetensors"))
        opt_tensors, opt_plain = _flatten_optimizer(opt)
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "state.json").write_text(json.dumps({**meta, "step": step, "optimizer": opt_plain}, default=str))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text(ckpt_root / "latest", final.name)
    for old in sorted(p for p in ckpt_root.glob("step-*") if p != final)[:-max(keep - 1, 0) or None]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    return Path(run_dir) / "checkpoints" / pointer.read_text().strip()


def load(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """Restore model (and optimizer) in place; returns the JSON state. Never unpickles anything."""
    try:
        state = json.loads((path / "state.json").read_text())
        missing, unexpected = load_model(model, str(path / "model.safetensors"), strict=False)
        if unexpected or any(not k.endswith("lm_head.weight") for k in missing):
            raise CheckpointError(f"checkpoint {path}: does not match the model (missing {missing}, "
                                  f"unexpected {unexpected})")
        if opt is not None:
            tensors = load_file(str(path / "optimizer.safetensors"))
            opt.load_state_dict(_unflatten_optimizer(tensors, state["optimizer"]))
    except (OSError, json.JSONDecodeError, SafetensorError, KeyError, RuntimeError) as err:
        raise CheckpointError(f"checkpoint {path} is unreadable or corrupt: {err}") from None
    return state
