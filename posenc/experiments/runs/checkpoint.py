"""Checkpoints: safetensors for tensors, JSON for the rest; written to a temp folder and renamed,
then a `latest` pointer swapped atomically. A crash at any moment leaves the previous good
checkpoint in place; a corrupt one is reported with its path."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model

from posenc.atomic_files import to_json, write_text


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
    final = ckpt_root / f"step-{step:08d}"
    if final not in _step_dirs(ckpt_root):  # a complete checkpoint of this step holds the same numbers
        _write(ckpt_root, final, step, model, opt, meta)
    write_text(ckpt_root / "latest", final.name)
    # Only checkpoints older than this one are pruned: never a later one of an earlier attempt.
    older = [p for p in _step_dirs(ckpt_root) if step_of(p) < step]
    for old in older[: max(0, len(older) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write(ckpt_root: Path, final: Path, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer,
           meta: dict[str, Any]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=ckpt_root))
    try:
        try:
            save_model(model, str(tmp / "model.safetensors"))
            opt_tensors, opt_plain = _flatten_optimizer(opt)
            save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        except SafetensorError as err:  # safetensors reports a full disk as its own error: an OSError to callers
            raise OSError(errno.EIO, f"safetensors could not write ({err})", str(tmp)) from None
        (tmp / "state.json").write_text(to_json({**meta, "step": step, "optimizer": opt_plain}))
        if final.exists():  # an incomplete folder under the final name (only by hand): replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


STEP_NAME = re.compile(r"step-\d{8}")
FILES = ("state.json", "model.safetensors", "optimizer.safetensors")


def step_of(path: Path) -> int:
    return int(path.name.removeprefix("step-"))


def _step_dirs(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest first: a folder only gets its step-* name once fully written."""
    found = [p for p in ckpt_root.glob("step-*") if STEP_NAME.fullmatch(p.name) and p.is_dir()
             and not p.is_symlink() and all((p / f).is_file() for f in FILES)]
    return sorted(found, key=step_of)


def latest(run_dir: Path) -> Path | None:
    """The newest checkpoint of the run, or None if it has none. The `latest` pointer must name a
    step folder inside this run's checkpoints/; without a pointer (lost, or a kill between the
    rename and the pointer swap) the newest complete step folder is the latest."""
    ckpt_root = Path(run_dir) / "checkpoints"
    pointer = ckpt_root / "latest"
    if not pointer.exists():
        found = _step_dirs(ckpt_root) if ckpt_root.is_dir() else []
        return found[-1] if found else None
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"checkpoint pointer {pointer} is unreadable: {err}") from None
    target = ckpt_root / name
    if not STEP_NAME.fullmatch(name) or target.is_symlink() or not target.is_dir():
        raise CheckpointError(f"checkpoint pointer {pointer} holds {name[:80]!r}: allowed is the name of a "
                              f"step-NNNNNNNN folder in {ckpt_root} (remove the pointer to use the newest one)")
    return target


def sweep_temp(run_dir: Path) -> None:
    """Remove .tmp-* folders left by a checkpoint write that was killed (only one writer per run)."""
    for tmp in (Path(run_dir) / "checkpoints").glob(".tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)


def _checked_state(file: Path, state: Any) -> dict[str, Any]:
    """state.json as a whole (a hand-edited one included): an object whose step is a count of steps, whose
    history is that many step records, and whose optimizer entry is an object; else one line naming the file."""
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{file} is not a posenc checkpoint state: {what} (restore it, or remove the "
                               f"step folder to resume from the one before)")

    if not isinstance(state, dict):
        raise bad(f"a JSON object is needed, not {type(state).__name__}")
    for key, kind in (("step", int), ("history", list), ("optimizer", dict)):
        if key not in state:
            raise bad(f"the key {key!r} is missing")
        if not isinstance(state[key], kind) or isinstance(state[key], bool):
            raise bad(f"{key}={state[key]!r} is not a{'n' if kind is int else ''} {kind.__name__}")
    step, history = state["step"], state["history"]
    if step < 0 or len(history) != step or not all(isinstance(h, dict) and h.get("step") == i + 1
                                                   for i, h in enumerate(history)):
        raise bad(f"step={step} with {len(history)} history records numbered otherwise: one record per step, "
                  "numbered 1..step")
    return state


def load(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """Restore model (and optimizer) in place; returns the JSON state. Never unpickles anything."""
    try:
        state = _checked_state(path / "state.json", json.loads((path / "state.json").read_text()))
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
