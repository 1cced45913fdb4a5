"""Token streams (bytes here; posenc.data.tokenizer for the others), deterministic splits and batches that
are pure functions of (seed, step), so an interrupted run resumed from a checkpoint sees exactly the same
batches."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from posenc.data.corpus import SOURCES, Corpus, load_builtin
from posenc.errors import bad_value


def load_corpus(name_or_path: str, field: str = "data.corpus") -> Corpus:
    """A built-in corpus name or a path to a non-empty UTF-8 text file. Bytes that are not UTF-8
    are an error, not U+FFFD: a model trained on replaced bytes learns another text."""
    if name_or_path in SOURCES:
        return load_builtin(name_or_path)
    allowed = f"a built-in corpus ({', '.join(SOURCES)}) or a non-empty UTF-8 text file"
    path = Path(name_or_path)
    if not path.is_file():
        raise bad_value(field, name_or_path, allowed)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise bad_value(field, name_or_path, f"{allowed} ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise bad_value(field, name_or_path, f"{allowed}: byte 0x{err.object[err.start]:02x} at offset "
                                             f"{err.start} is not UTF-8") from None
    if not text:
        raise bad_value(field, name_or_path, f"{allowed}: the file is empty")
    return Corpus(path.name, text)


def byte_tokens(text: str) -> Tensor:
    """UTF-8 bytes as int64 token ids (vocab 256)."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).to(torch.int64)


def split(tokens: Tensor, val_fraction: float) -> tuple[Tensor, Tensor]:
    """Train on the head, validate on the tail: no window straddles both."""
    cut = int(len(tokens) * (1 - val_fraction))
    return tokens[:cut], tokens[cut:]


def batch_generator(seed: int, step: int, rank: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(hash((seed, step, rank)) & 0x7FFF_FFFF_FFFF_FFFF)


def sample_starts(n_tokens: int, batch_size: int, seq_len: int, generator: torch.Generator) -> list[int]:
    """Where the batch's random windows of seq_len + 1 tokens start."""
    if n_tokens <= seq_len + 1:
        raise bad_value("data.seq_len", seq_len, f"shorter than the split ({n_tokens} tokens)")
    return torch.randint(0, n_tokens - seq_len - 1, (batch_size,), generator=generator).tolist()


def sample_batch(tokens: Tensor, batch_size: int, seq_len: int, generator: torch.Generator,
                 first: Sequence[int] = ()) -> tuple[Tensor, Tensor]:
    """Random windows: inputs (B,L) and next-token targets (B,L), each row begun with `first` (windows_at)."""
    return windows_at(tokens, sample_starts(len(tokens), batch_size, seq_len, generator), seq_len, first)


def windows_at(tokens: Tensor, starts: list[int], seq_len: int, first: Sequence[int] = ()) -> tuple[Tensor, Tensor]:
    """Inputs (B,L) and next-token targets (B,L) of the windows at `starts`. `first` (a pretrained model's BOS
    where its tokenizer adds one: posenc.experiments.sequence_start) begins every row and takes one of the L input
    positions: a row is first + text[s : s + L + 1 - len(first)], so the BOS is an input, never a target, and L
    text tokens are targets either way. Without it the rows are text[s : s + L + 1], as ever."""
    if len(first) > 1:  # a second token before the text would be a target
        raise bad_value("first", list(first), "[] or one token (the model's BOS)")
    text = seq_len + 1 - len(first)
    head = torch.tensor(list(first), dtype=tokens.dtype).expand(len(starts), -1)  # (B,len(first))
    windows = torch.cat([head, torch.stack([tokens[s : s + text] for s in starts])], dim=1)  # (B,L+1)
    return windows[:, :-1], windows[:, 1:]


def target_bytes(byte_lengths: Tensor, starts: list[int], seq_len: int, first: Sequence[int] = ()) -> int:
    """UTF-8 bytes of the text the targets of windows at `starts` cover (windows_at's targets: the text from
    s + 1 - len(first), L tokens)."""
    shift = 1 - len(first)
    return sum(int(byte_lengths[s + shift : s + shift + seq_len].sum()) for s in starts)
