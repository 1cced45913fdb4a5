"""RULER-style tasks: every prompt has exactly the asked length, ends with RULER's answer prefix,
re-tokenizes to itself, and its answers are what a plain reading of its text says they are (an
oracle that parses the decoded prompt: needles by regex, variable chains resolved, words counted);
prompts are reproducible and vary with seed and trial; score is RULER's string_match_all."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from posenc.experiments.extend.ruler import TASKS, RulerBuilder, score
from posenc.experiments.extend.ruler.templates import CWE, FWE, NIAH_PLURAL, NIAH_SINGULAR, VT
from posenc.experiments.extend.ruler.words import KEYS, pseudo_words
from tests.conftest import smollm2_gguf

NIAH = [name for name in TASKS if name.startswith("niah")]
# (keys, values per key, keys asked) of RULER's configs (scripts/synthetic.yaml)
NIAH_SHAPES = {"niah_single": (1, 1, 1), "niah_multikey": (4, 1, 1), "niah_multivalue": (1, 4, 1),
               "niah_multiquery": (4, 1, 4)}


def char_encode(text: str) -> list[int]:
    """A stand-in tokenizer: one id per character."""
    return [ord(c) for c in text]


def char_decode(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def niah_answers(text: str, task: str) -> list[str]:
    needles = re.findall(r"^One of the special magic numbers for ([\w-]+) is: (\d{7})\.$", text, re.M)
    keys, values, asked = NIAH_SHAPES[task]
    assert len(needles) == keys * values and len({key for key, _ in needles}) == keys
    query = re.findall(r"for (.+?) mentioned in the provided text\?", text)[-1]
    queried = re.split(r", and |, ", query)
    assert len(queried) == asked
    return [value for key in queried for key_, value in needles if key_ == key]


def vt_answers(text: str) -> set[str]:
    task = text[text.rindex("Memorize and track") :]  # past the worked example
    bound = dict(re.findall(r"^VAR (\w+) = (\d+)$", task, re.M))
    links = dict(re.findall(r"^VAR (\w+) = VAR (\w+)$", task, re.M))
    while links:  # resolve one hop at a time; a name never binds twice
        done = {name: bound[source] for name, source in links.items() if source in bound}
        assert done, "a chain that never reaches a value"
        bound.update(done)
        links = {name: source for name, source in links.items() if name not in done}
    value = re.findall(r"assigned the value (\d+) in the text above", task)[-1]
    return {name for name, v in bound.items() if v == value}


def counted_words(text: str, start: str, stop: str) -> Counter:
    return Counter(text[text.rindex(start) + len(start) : text.rindex(stop)].split())


def cwe_answers(text: str) -> set[str]:
    listing = text[text.rindex(CWE[0]) + len(CWE[0]) : text.rindex(CWE[1])]
    entries = re.findall(r"(\d+)\. (\w+)", listing)
    assert [int(n) for n, _ in entries] == list(range(1, len(entries) + 1))
    assert re.sub(r"(\d+)\. (\w+)", "", listing).strip() == ""  # nothing else in the list
    ranked = Counter(word for _, word in entries).most_common()
    assert len(ranked) == 10 or ranked[9][1] > ranked[10][1]  # the top 10 is unambiguous
    return {word for word, _ in ranked[:10]}


def fwe_answers(text: str) -> list[str]:
    counts = counted_words(text, FWE[0], FWE[1])
    assert counts.pop("...") > 0  # RULER's noise word, the most frequent, is not an answer
    ranked = counts.most_common()
    assert ranked[0][1] > ranked[1][1] > ranked[2][1] > ranked[3][1]
    return [word for word, _ in ranked[:3]]


def answer_prefix_end(task: str) -> str:
    prefix = {"vt": VT, "cwe": CWE, "fwe": FWE}.get(task)
    if prefix is None:
        prefix = NIAH_SINGULAR if task in ("niah_single", "niah_multikey") else NIAH_PLURAL
    return prefix[2].rsplit("}", 1)[-1]


def check_prompt(prompt, text: str, task: str, length: int) -> None:
    """The properties every prompt keeps, read off its decoded text."""
    assert len(prompt.ids) == length and prompt.task == task
    assert text.endswith(answer_prefix_end(task))
    assert prompt.answer_tokens > 0
    if task in NIAH:
        assert sorted(prompt.answers) == sorted(niah_answers(text, task))  # the metric ignores order
    elif task == "vt":
        assert set(prompt.answers) == vt_answers(text) and len(prompt.answers) == 5
    elif task == "cwe":
        assert set(prompt.answers) == cwe_answers(text) and len(prompt.answers) == 10
    else:
        assert list(prompt.answers) == fwe_answers(text)


def check_needle_starts(prompt, decode) -> None:
    if prompt.task in ("cwe", "fwe"):
        assert prompt.needle_starts == ()
        return
    assert len(prompt.needle_starts) == len(prompt.answers)
    for start, answer in zip(prompt.needle_starts, prompt.answers, strict=True):
        line = decode(prompt.ids[start : start + 100]).lstrip("\n").split("\n")[0]
        assert (line.startswith(f"VAR {answer} = ") if prompt.task == "vt"
                else line.startswith("One of the special magic numbers") and answer in line)


@pytest.mark.parametrize("task", list(TASKS))
def test_every_length_from_the_minimum_gives_an_exact_prompt_with_the_right_answers(task):
    builder = RulerBuilder(char_encode)
    least = builder.min_length(task)
    # consecutive lengths hit every remainder of the last cut noise line and of the padding words
    for length in [*range(least, least + 40), 2 * least + 7, 8000]:
        prompt = builder.build(task, length, seed=1, trial=length % 3)
        check_prompt(prompt, char_decode(prompt.ids), task, length)
        check_needle_starts(prompt, char_decode)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from posenc.models.gguf import load_tokenizer

    return load_tokenizer(smollm2_gguf())


@pytest.mark.pretrained
@pytest.mark.parametrize("model_template", ["base", "smollm2_chat"])
def test_real_tokenizer_prompts_are_exact_seamless_and_right(smollm2_tokenizer, model_template):
    tokenizer = smollm2_tokenizer
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)
    builder = RulerBuilder(encode, model_template)
    lengths = (4096, 65_536) if model_template == "base" else (3001,)
    for task in TASKS:
        for length in (builder.min_length(task), 1500 + builder.min_length(task) % 7, *lengths):
            prompt = builder.build(task, length, seed=0, trial=2)
            text = tokenizer.decode(prompt.ids)
            assert encode(text) == prompt.ids  # no seams between the pieces
            check_prompt(prompt, text, task, length)
            check_needle_starts(prompt, tokenizer.decode)


@pytest.mark.parametrize("task", list(TASKS))
def test_prompts_are_reproducible_and_vary_with_seed_and_trial(task):
    length = RulerBuilder(char_encode).min_length(task) + 500
    build = lambda seed, trial: RulerBuilder(char_encode).build(task, length, seed, trial)
    first = build(3, 1)
    assert build(3, 1) == first  # a fresh builder: nothing carried over but the arguments
    for other in (build(4, 1), build(3, 2)):
        assert other.ids != first.ids and set(other.answers) != set(first.answers)


def test_needles_spread_over_the_whole_haystack():
    builder = RulerBuilder(char_encode)
    depths = [builder.build("niah_single", 4000, 0, trial).needle_starts[0] / 4000 for trial in range(60)]
    assert min(depths) < 0.15 and max(depths) > 0.85
    assert 0.3 < sum(d < 0.5 for d in depths) / len(depths) < 0.7


def test_cwe_switches_to_ruler_long_frequencies_at_4096():
    builder = RulerBuilder(char_encode)
    for length, common, rare in ((4095, 6, 1), (8000, 30, 3)):
        text = char_decode(builder.build("cwe", length, 0, 0).ids)
        listing = text[text.rindex(CWE[0]) + len(CWE[0]) : text.rindex(CWE[1])]
        counts = Counter(re.findall(r"\d+\. (\w+)", listing)).most_common()
        assert {c for _, c in counts[:10]} == {common}
        assert max(c for _, c in counts[10:]) == rare  # a few words used for padding appear once


class CountingEncode:
    def __init__(self) -> None:
        self.characters = 0

    def __call__(self, text: str) -> list[int]:
        self.characters += len(text)
        return char_encode(text)


@pytest.mark.parametrize("task", list(TASKS))
def test_a_long_prompt_is_built_from_pieces_not_by_tokenizing_it(task):
    encode = CountingEncode()
    builder = RulerBuilder(encode)
    builder.build(task, 65_536, 0, 0)
    encode.characters = 0
    builder.build(task, 65_536, 1, 0)  # repeated pieces are tokenized once per builder
    assert encode.characters < 0.05 * 65_536


@pytest.mark.parametrize(("output", "answers", "share"), [
    ("The special magic numbers are 1234567 and 7654321.", ["1234567", "7654321"], 1.0),
    ("The special magic number is 1234567.", ["1234567", "7654321"], 0.5),
    ("they are: ABCDE fghij", ["abcde", "FGHIJ", "KLMNO", "PQRST"], 0.5),  # case-insensitive
    ("1. kelmo 2. sudi", ["kelmo", "sudi", "bano"], 2 / 3),
    ("no answer here", ["1234567"], 0.0),
    ("x12345678", ["1234567"], 1.0),  # RULER matches substrings, not whole words
])
def test_score_is_rulers_string_match_all_for_one_prediction(output, answers, share):
    assert score(output, answers) == pytest.approx(share)


def test_vocabularies_cannot_credit_one_answer_for_another():
    words = pseudo_words()
    assert len(set(words)) == len(words) >= 10_000
    inside = {w[i:j] for w in words for i in range(len(w)) for j in range(i + 1, len(w) + 1) if j - i < len(w)}
    assert not inside & set(words)  # no word is inside another
    assert len(set(KEYS)) == len(KEYS)


@pytest.mark.parametrize(("call", "field"), [
    (lambda b: b.build("niah_sigle", 1000, 0, 0), "ruler.tasks"),
    (lambda b: b.min_length("passkey"), "ruler.tasks"),
    (lambda b: b.build("niah_single", 50, 0, 0), "lengths"),
    (lambda b: b.build("vt", b.min_length("vt") - 1, 0, 0), "lengths"),
    (lambda b: b.build("cwe", 2000.0, 0, 0), "lengths"),
    (lambda b: RulerBuilder(char_encode, "chatml"), "ruler.model_template"),
])
def test_bad_input_is_one_line_naming_the_field(call, field):
    with pytest.raises(ValueError, match=field) as error:
        call(RulerBuilder(char_encode))
    assert "\n" not in str(error.value)
