"""The Wikipedia corpus: pages chosen by namespace and redirect, markup removed to prose, the dump
checked against its pinned SHA-256, the cleaned text cached atomically; and, against the real wheel
on PyPI, that the pin still matches what the index serves."""

from __future__ import annotations

import bz2
import hashlib
import zipfile

import pytest

from posenc.data import wikipedia
from posenc.data.tokens import load_corpus

NS = "http://www.mediawiki.org/xml/export-0.10/"


def page(title: str, text: str, ns: int = 0, redirect: bool = False) -> str:
    extra = f'<redirect title="{title}x" />' if redirect else ""
    return (f"<page><title>{title}</title><ns>{ns}</ns><id>1</id>{extra}"
            f"<revision><text xml:space=\"preserve\">{text}</text></revision></page>")


def dump(*pages: str) -> bytes:
    return f'<mediawiki xmlns="{NS}">{"".join(pages)}</mediawiki>'.encode()


def test_articles_keep_main_namespace_pages_that_are_not_redirects():
    xml = dump(page("Alpha", "Alpha text."), page("Talk:Alpha", "chat", ns=1), page("Old", "x", redirect=True),
               page("Moved", "#REDIRECT [[Alpha]]"), page("Empty", "  "), page("Beta", "Beta text."))
    assert [title for title, _ in wikipedia.articles(xml)] == ["Alpha", "Beta"]


def test_plain_text_keeps_prose_and_drops_markup_citations_files_and_categories():
    wikitext = ("'''Anarchism''' is a [[political philosophy|philosophy]] {{Citation needed}}"
                "&lt;ref&gt;Woodcock, p. 1&lt;/ref&gt; of [[liberty]].\n[[File:A.png|thumb|A caption]]\n"
                "== History ==\nIt began.\n[[Category:Politics]]")
    import html

    text = wikipedia.plain_text(html.unescape(wikitext))
    assert text == "Anarchism is a philosophy  of liberty.\nHistory\nIt began."  # a removed template leaves its spaces


def _fake_pip(monkeypatch, payload: bytes) -> list[list[str]]:
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        folder = cmd[cmd.index("--dest") + 1]
        with zipfile.ZipFile(f"{folder}/gensim-4.4.0-cp311-cp311-manylinux_2_28_x86_64.whl", "w") as wheel:
            wheel.writestr(wikipedia.MEMBER, payload)

        class Done:
            returncode, stderr = 0, ""

        return Done()

    monkeypatch.setattr(wikipedia.subprocess, "run", run)
    return calls


def test_a_dump_that_does_not_match_the_pin_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path))
    _fake_pip(monkeypatch, bz2.compress(dump(page("Alpha", "Alpha text."))))
    with pytest.raises(wikipedia.CorpusUnavailable, match="not the pinned"):
        wikipedia.wikipedia_sample_text()
    assert list(tmp_path.iterdir()) == []  # nothing half-written in the cache


def test_the_cleaned_text_is_built_once_cached_and_reused(monkeypatch, tmp_path):
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "cache"))
    payload = bz2.compress(dump(page("Alpha", "'''Alpha''' text."), page("Beta", "Beta [[text]].")))
    monkeypatch.setattr(wikipedia, "MEMBER_SHA256", hashlib.sha256(payload).hexdigest())
    calls = _fake_pip(monkeypatch, payload)
    assert wikipedia.wikipedia_sample_text() == "Alpha\n\nAlpha text.\n\nBeta\n\nBeta text.\n"
    assert wikipedia.wikipedia_sample_text() == "Alpha\n\nAlpha text.\n\nBeta\n\nBeta text.\n"
    assert len(calls) == 1  # the second call read the cache
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [f"wikipedia_sample-{wikipedia.MEMBER_SHA256[:16]}.txt"]
    assert "--no-deps" in calls[0] and wikipedia.GENSIM_WHEEL[0] in calls[0]


def test_a_failed_download_is_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path))

    class Failed:
        returncode, stderr = 1, "ERROR: No matching distribution found for gensim==4.4.0"

    monkeypatch.setattr(wikipedia.subprocess, "run", lambda cmd, **kwargs: Failed())
    with pytest.raises(wikipedia.CorpusUnavailable, match="No matching distribution"):
        wikipedia.wikipedia_sample_text()


@pytest.mark.slow
def test_the_pinned_wheel_on_pypi_still_holds_the_pinned_dump(tmp_path, monkeypatch):
    """Downloads the real wheel (~28 MB from PyPI, the one hub this project may reach)."""
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path))
    corpus = load_corpus("wikipedia_sample")
    assert corpus.text.startswith("Anarchism\n\nAnarchism is a political philosophy")
    assert corpus.text.count("\n\n") > 200 and 2_500_000 < len(corpus.text.encode()) < 3_500_000
    assert corpus.sha256 == wikipedia.TEXT_SHA256  # the text RESULTS.md was trained on
    # mwparserfromhell leaves markup it cannot parse as text: a few places in 2.9 MB, not the norm
    assert sum(corpus.text.count(mark) for mark in ("{{", "[[", "<ref")) < 20
