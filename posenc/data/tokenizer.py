"""What turns a corpus into tokens for a language-model run (`data.tokenizer`): UTF-8 bytes (the default,
vocabulary 256), the SmolLM2 tokenizer that ships inside the built-in GGUF (`smollm2`), or a Hugging Face
`tokenizer.json` file. A tokenizer has a name and a fingerprint (SHA-256 of what it computes: its canonical
JSON), so a run records which one made its tokens and a resume with another is refused.

Every token carries the number of UTF-8 bytes of text it covers, so bits per byte (total nats / (ln 2 x
bytes)) compares runs with different tokenizers. The token stream of a corpus is cached per (text,
tokenizer) fingerprint: encoding Wikipedia's 2.9 MB with a subword tokenizer takes seconds, once.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from posenc.cache import cache_dir
from posenc.errors import bad_value

BUILTIN = ("bytes", "smollm2")  # data.tokenizer names; anything else is a tokenizer.json path
ALLOWED = "bytes, smollm2 (the SmolLM2 tokenizer in the built-in GGUF), or a path to a tokenizer.json file"
BYTES_FINGERPRINT = hashlib.sha256(b"posenc utf-8 bytes, vocabulary 256").hexdigest()


@dataclass(frozen=True)
class Tokens:
    """A token stream and the UTF-8 bytes of text each token covers (both (N,))."""

    ids: Tensor  # int64
    byte_lengths: Tensor  # int32; sums to the bytes of the text the stream covers

    def __len__(self) -> int:
        return len(self.ids)

    def split(self, val_fraction: float) -> tuple[Tokens, Tokens]:
        """Train on the head, validate on the tail (posenc.data.tokens.split's cut)."""
        cut = int(len(self.ids) * (1 - val_fraction))
        return Tokens(self.ids[:cut], self.byte_lengths[:cut]), Tokens(self.ids[cut:], self.byte_lengths[cut:])


@dataclass(frozen=True, eq=False)
class TextTokenizer:
    name: str  # as the run's config says: bytes, smollm2, or the file's absolute path
    sha256: str  # fingerprint of what it computes
    vocab_size: int
    backend: Any = None  # a tokenizers.Tokenizer; None for bytes

    def record(self) -> dict[str, str]:
        """What run.json keeps of it."""
        return {"tokenizer": self.name, "tokenizer_sha256": self.sha256}

    def encode(self, text: str) -> Tokens:
        if self.backend is None:
            ids = torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).to(torch.int64)
            return Tokens(ids, torch.ones(len(ids), dtype=torch.int32))
        encoding = self.backend.encode(text, add_special_tokens=False)
        ends = np.array([end for _, end in encoding.offsets], dtype=np.int64)
        return Tokens(torch.tensor(encoding.ids, dtype=torch.int64), torch.from_numpy(_byte_lengths(text, ends)))

    def decode(self, ids: Tensor | list[int]) -> str:
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        if self.backend is None:
            return bytes(ids).decode("utf-8", errors="replace")
        return self.backend.decode(ids, skip_special_tokens=False)


def _byte_lengths(text: str, char_ends: np.ndarray) -> np.ndarray:
    """Bytes each token covers: from the previous token's end to its own (character offsets -> UTF-8
    bytes). Ends are made non-decreasing, so a character split over two byte-level tokens counts once."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    width = 1 + (points >= 0x80).astype(np.int64) + (points >= 0x800) + (points >= 0x10000)
    byte_at = np.concatenate([[0], np.cumsum(width)])  # char offset -> byte offset
    ends = np.maximum.accumulate(byte_at[char_ends]) if len(char_ends) else char_ends
    return np.diff(ends, prepend=0).astype(np.int32)


def check_name(spec: Any, field: str = "data.tokenizer") -> str:
    """The spec as a run's config keeps it (a file path made absolute), or a ValueError naming the field."""
    if not isinstance(spec, str) or not spec.strip():
        raise bad_value(field, spec, ALLOWED)
    if spec in BUILTIN:
        return spec
    path = Path(spec).expanduser()
    if not path.is_file():
        raise bad_value(field, spec, f"{ALLOWED} (no such file)")
    return str(path.absolute())


@functools.lru_cache(maxsize=8)
def _load(spec: str, stamp: tuple) -> TextTokenizer:
    if spec == "bytes":
        return TextTokenizer("bytes", BYTES_FINGERPRINT, 256)
    from tokenizers import Tokenizer

    try:
        backend = _smollm2() if spec == "smollm2" else Tokenizer.from_file(spec)
    except Exception as err:  # a file that is not a tokenizer.json
        raise bad_value("data.tokenizer", spec, f"{ALLOWED}: it could not be read ({type(err).__name__}: "
                                                f"{str(err)[:120]})") from None
    canonical = backend.to_str()
    return TextTokenizer(spec, hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
                         backend.get_vocab_size(with_added_tokens=True), backend)


def _stamp(spec: str) -> tuple:
    """What makes a cached tokenizer stale: the file's size and time (its content is fingerprinted on load)."""
    path = _smollm2_gguf() if spec == "smollm2" else Path(spec) if spec != "bytes" else None
    if path is None:
        return ()
    stat = path.stat()
    return str(path), stat.st_size, stat.st_mtime_ns


def load_tokenizer(spec: str, field: str = "data.tokenizer") -> TextTokenizer:
    spec = check_name(spec, field)
    return _load(spec, _stamp(spec))


def _smollm2_gguf() -> Path:
    from posenc.models.gguf import builtin_smollm2_path

    return builtin_smollm2_path()


def _smollm2() -> Any:
    """The GGUF's tokenizer (posenc.models.gguf.load_tokenizer, as `posenc extend` and gguf:smollm2 fine-tuning
    load it), kept as tokenizer.json in the cache: transformers' rebuild from the GGUF takes ~10-40 s."""
    from tokenizers import Tokenizer

    from posenc.models.gguf import load_tokenizer as gguf_tokenizer

    gguf = _smollm2_gguf()
    key = hashlib.sha256(repr(_stamp("smollm2")).encode()).hexdigest()[:16]
    cached = cache_dir() / "tokenizers" / f"smollm2-{key}.json"
    if cached.is_file():
        return Tokenizer.from_file(str(cached))
    backend = gguf_tokenizer(gguf).backend_tokenizer
    with contextlib.suppress(OSError):
        _write_atomic(cached, backend.to_str().encode("utf-8"))
    return backend


def _write_atomic(path: Path, data: bytes) -> None:
    from posenc.atomic_files import atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def encode_corpus(tokenizer: TextTokenizer, text: str, text_sha256: str) -> Tokens:
    """The whole corpus as tokens, cached per (text, tokenizer) fingerprint (bytes: computed, no cache)."""
    if tokenizer.backend is None:
        return tokenizer.encode(text)
    path = cache_dir() / "tokens" / f"{text_sha256[:20]}-{tokenizer.sha256[:20]}.npz"
    if path.is_file():
        try:
            with np.load(path) as stored:
                return Tokens(torch.from_numpy(stored["ids"].astype(np.int64)),
                              torch.from_numpy(stored["byte_lengths"]))
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache file: encode again and replace it
    tokens = tokenizer.encode(text)
    buffer = io.BytesIO()
    np.savez(buffer, ids=tokens.ids.numpy().astype(np.int32), byte_lengths=tokens.byte_lengths.numpy())
    with contextlib.suppress(OSError):  # a read-only cache costs the next run an encode, nothing else
        _write_atomic(path, buffer.getvalue())
    return tokens


__all__ = ["ALLOWED", "BUILTIN", "TextTokenizer", "Tokens", "check_name", "encode_corpus", "load_tokenizer"]
