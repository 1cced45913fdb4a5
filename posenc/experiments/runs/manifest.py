"""run.json: which command made a run folder, with which settings, on which text. Written before
any work, read by every later command that touches the folder, so none can continue a run with
other settings (and relabel it), write into a folder posenc did not make, or score a run on text
that changed since."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from posenc.atomic_files import write_json
from posenc.errors import bad_value

MANIFEST = "run.json"
_MISSING = object()
# Settings added after run folders were first written, each with the value every older run computed with: a folder
# from before one of them continues when it is asked at that value (train reads its folders through today's schema)
ADDED_SETTINGS: dict[str, Any] = {"trainer.compile": False}


def read(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not {"command", "config"} <= set(data):
            raise ValueError("not a posenc manifest")
    except (OSError, ValueError) as err:
        raise bad_value("run_dir", str(run_dir), f"a posenc run folder ({path} is unreadable: {err})") from None
    return data


def write(run_dir: Path, command: str, config: dict[str, Any], corpus: dict[str, str] | None,
          **extra: Any) -> Path:
    return write_record(run_dir, {"command": command, "config": config, "corpus": corpus, **extra})


def write_record(run_dir: Path, record: dict[str, Any]) -> Path:
    return write_json(Path(run_dir) / MANIFEST, record)


def holds_results(folder: Path) -> bool:
    """Anything besides run.json: a run that failed before writing any is removed with its folder."""
    return any(p.name != MANIFEST for p in folder.iterdir())


def is_empty(folder: Path) -> bool:
    """Nothing in it but what a killed atomic write leaves (posenc.atomic_files' `.NAME.*.tmp`), which goes."""
    if not folder.exists():
        return True
    if not folder.is_dir():
        return False
    leftovers = [p for p in folder.iterdir() if p.is_file() and p.name.startswith(".") and p.name.endswith(".tmp")]
    if len(leftovers) != sum(1 for _ in folder.iterdir()):
        return False
    for leftover in leftovers:
        leftover.unlink(missing_ok=True)
    return True


def _flat(config: dict[str, Any]) -> dict[str, Any]:
    """{"model": {"n_layer": 2}} -> {"model.n_layer": 2}, values as JSON reads them back."""
    config = json.loads(json.dumps(config, default=str))
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def differences(stored: dict[str, Any], requested: dict[str, Any], ignore: Iterable[str] = ()) -> list[str]:
    """`key: old -> new` for every dotted key that differs, except keys in (or under) `ignore`."""
    ignore = tuple(ignore)
    a, b = _flat(stored), _flat(requested)
    a = {**{key: value for key, value in ADDED_SETTINGS.items() if key in b}, **a}
    out = []
    for key in sorted(set(a) | set(b)):
        if any(key == i or key.startswith(f"{i}.") for i in ignore):
            continue
        old, new = a.get(key, _MISSING), b.get(key, _MISSING)
        if old != new:
            show = lambda v: "(absent)" if v is _MISSING else repr(v)
            out.append(f"{key}: {show(old)} -> {show(new)}")
    return out


def check_same_run(run_dir: Path, stored: dict[str, Any], command: str, config: dict[str, Any],
                   ignore: Iterable[str], hint: str) -> None:
    """Refuse to continue `stored` (a manifest) as `command` with `config` if anything that changes
    results differs; the message names every such key."""
    if stored["command"] != command:
        raise bad_value("run_dir", str(run_dir), f"a `posenc {command}` run folder (this one holds a "
                                                 f"`posenc {stored['command']}` run)")
    changed = differences(stored["config"], config, ignore)
    if changed:
        raise bad_value("run_dir", str(run_dir), f"the settings it was started with; asked to change "
                                                 f"{'; '.join(changed)} ({hint})")


def check_corpus(stored: dict[str, str] | None, now: dict[str, str], field: str = "data.corpus") -> None:
    """The text and the tokenizer must be the ones the run was trained on (a record without a tokenizer is
    from before data.tokenizer existed: bytes)."""
    if stored and stored.get("sha256") and stored["sha256"] != now["sha256"]:
        raise bad_value(field, now["name"], f"the text the run was trained on: it has changed since "
                                            f"(sha256 {stored['sha256'][:12]}... then, {now['sha256'][:12]}... now)")
    then, later = (stored or {}).get("tokenizer_sha256"), now.get("tokenizer_sha256")
    if then and later and then != later:
        raise bad_value("data.tokenizer", now.get("tokenizer"), f"the tokenizer the run was trained with "
                        f"({stored.get('tokenizer')}, sha256 {then[:12]}...; this one is {later[:12]}...)")


def shrunk_lists(stored: dict[str, Any], requested: dict[str, Any], keys: Iterable[str]) -> list[str]:
    """`key: missing items` for every list in `keys` that lost items the stored run holds: a continuation may
    add schemes, tasks or seeds (new units), never drop one (its results would be deleted from the run)."""
    a, b = _flat(stored), _flat(requested)
    out = []
    for key in keys:
        old, new = a.get(key) or [], b.get(key) or []
        missing = [item for item in old if item not in new]
        if missing:
            out.append(f"{key} drops {', '.join(map(str, missing))}")
    return out

