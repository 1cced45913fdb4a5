"""What `posenc extend --resume DIR` continues: the settings the unfinished run was started with (its run.json,
or an older folder's config.json), with whatever else was asked applied on top; run() then refuses, naming the
key, any change the run rule does not allow (a setting given with --resume is never silently dropped)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posenc.errors import bad_value
from posenc.experiments.config import loader as config_loader
from posenc.experiments.extend.config import ExtendConfig


def resumed_config(run_dir: Path, preset: tuple[str, Any] | None = None) -> ExtendConfig:
    """The settings an unfinished run was started with (its run.json, or an older folder's config.json); `preset`
    (the flag given and its value, e.g. ("--preset", "long")) is refused: the run keeps its own settings."""
    from posenc.experiments.extend.run import stored_extend_run

    stored = stored_extend_run(run_dir) if run_dir.is_dir() else None
    if stored is None or stored.get("command") != "extend":
        raise bad_value("resume", str(run_dir), "an extend run folder (holding run.json)")
    if preset is not None:
        raise bad_value(preset[0], preset[1], "no preset with --resume: the run keeps the settings it was started with")
    return config_loader.build(ExtendConfig, stored["config"])


def resumed_with(stored: ExtendConfig, config_file: str | None, asked: list[str]) -> ExtendConfig:
    """The stored settings with the YAML file and the dotted overrides `asked` on top."""
    return config_loader.load(ExtendConfig, config_file, asked, base=stored) if asked or config_file else stored


__all__ = ["resumed_config", "resumed_with"]
