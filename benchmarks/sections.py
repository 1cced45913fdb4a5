"""A markdown file of several generated sections (BENCHMARKS-gpu.md: static and measured), each between
`<!-- NAME:begin -->` and `<!-- NAME:end -->`: a generator rewrites its own section and leaves the rest."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, name: str, text: str) -> None:
    """Put text between NAME's markers in path (appended, with the markers, if the file or section is new)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{text.rstrip()}\n{end}"
    old = path.read_text() if path.exists() else ""
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + block + rest.split(end, 1)[1]
    else:
        new = (old.rstrip() + "\n\n" if old.strip() else "") + block + "\n"
    path.write_text(new)


__all__ = ["replace_section"]
