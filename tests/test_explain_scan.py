"""The streaming scan of ``explain`` (issue 16): any split of a log gives the answer a line-by-line pass
gives, and the few regex passes that find the candidate lines miss none.

The corpus of real failures (tests/explain_corpus) is fed whole, one line at a time, and in random
pieces (seeded; the seed is in the failure message); every part of the result must agree: the causes
with their ranks, counts, evidence and texts, the first failure, the kept lines and the counts.
"""

from __future__ import annotations

import os
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpdoctor.causes.catalogue import CAUSES
from ddpdoctor.causes.matcher import LogScanner, _scan_plan, _triggers, scan_text

CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "explain_corpus", "cases")
LOGS = sorted(os.listdir(CASES))


def _result(result) -> tuple:
    """Everything a ScanResult says, as plain values."""
    return ([(m.cause.id, sorted(m.ranks), m.count, m.evidence, m.extra, m.groups, m.meaning, m.fix)
             for m in result.matches],
            result.first_failure, result.cut_lines, result.chars, result.kept, result.evidence_partial)


def _fed(pieces) -> tuple:
    scanner = LogScanner()
    for piece in pieces:
        scanner.feed(piece)
    return _result(scanner.finish())


def _read(name: str) -> str:
    with open(os.path.join(CASES, name), encoding="utf-8", errors="replace") as f:
        return f.read()


def test_corpus_is_there():
    assert len(LOGS) >= 110


@pytest.mark.parametrize("name", LOGS)
def test_streamed_answers_as_line_by_line_on_the_corpus(name):
    text = _read(name)
    by_line = _fed(line for line in text.splitlines(keepends=True))
    assert by_line == _fed([text])
    assert by_line == _result(scan_text(text))  # the whole-text pass
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    for _ in range(4):
        cuts = sorted(rnd.randrange(len(text) + 1) for _ in range(rnd.randint(1, 60)))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        assert _fed(pieces) == by_line, f"{name}: random split differs (seed {seed}, cuts {cuts[:8]}...)"


def test_streamed_answers_as_line_by_line_on_corpus_logs_joined():
    """Many logs in one (several failures, ranks, summaries), with Windows and progress-bar line ends."""
    rnd = random.Random(16)
    text = "".join(_read(n) for n in rnd.sample(LOGS, 25))
    text = text.replace("\n", "\r\n", 200).replace("\n", "\r", 50)
    by_line = _fed(re.split(r"(?<=\n)", text))
    for _ in range(5):
        cuts = sorted(rnd.randrange(len(text) + 1) for _ in range(rnd.randint(1, 400)))
        assert _fed([text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]) == by_line


# -- the candidate search itself ------------------------------------------------------------------

def _plan_finds(literals: tuple, text: str) -> dict:
    """line start -> the literals the scan plan says the line holds (text: whole lines)."""
    found: dict = {}
    for rx, said in _scan_plan(literals):
        if rx is None:
            for lit in said:
                for m in re.finditer(re.escape(lit), text):
                    found.setdefault(text.rfind("\n", 0, m.start()) + 1, set()).add(lit)
            continue
        for m in rx.finditer(text):
            found.setdefault(text.rfind("\n", 0, m.start()) + 1, set()).update(said[m.lastindex])
    return found


def _check_plan(literals: tuple, text: str) -> None:
    text = text.replace("\r", "\n") + "\n"
    found = _plan_finds(literals, text)
    start = 0
    for line in text.split("\n")[:-1]:
        held = {lit for lit in literals if lit in line}
        if held:
            assert start in found and held <= found[start], (line, held, found.get(start))
        else:
            assert start not in found, (line, found[start])
        start += len(line) + 1


CATALOGUE_LITERALS = _triggers(tuple(CAUSES))[0]


def test_plan_of_the_catalogue_is_a_few_passes():
    plan = _scan_plan(CATALOGUE_LITERALS)
    passes = sum(1 if rx is not None else len(said) for rx, said in plan)
    assert passes <= 6, [rx.pattern[:20] if rx is not None else said for rx, said in plan]
    every: list = []
    for rx, said in plan:  # each literal once: a regex says it first in its own entry
        every += said if rx is None else [entry[0] for entry in said[1:]]
    assert sorted(every) == sorted(CATALOGUE_LITERALS)


def _pieces(literals: tuple):
    frags = [lit[i:j] for lit in literals for i, j in ((0, len(lit) // 2), (len(lit) // 3, len(lit)))]
    return st.sampled_from(list(literals) + frags + [" ", "\n", "e", "x", "[rank1]: ", "é", "\r"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_pieces(CATALOGUE_LITERALS), max_size=60))
def test_plan_finds_every_line_with_a_catalogue_literal(parts):
    _check_plan(CATALOGUE_LITERALS, "".join(parts))


# literals that overlap each other, share anchors, repeat letters: the cases a trie can get wrong (common
# letters, found by str.find in small groups, and rare ones, found by the regexes)
_words = st.text(alphabet="abeXYZ ", min_size=3, max_size=7)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_words, min_size=1, max_size=14, unique=True).flatmap(
    lambda lits: st.tuples(st.just(tuple(sorted(lits))),
                           st.lists(st.sampled_from(lits + ["a", "X", "e", " ", "\n", "aX", "Ye"]), max_size=40))))
def test_plan_finds_every_line_with_any_literal(case):
    literals, parts = case
    _check_plan(literals, "".join(parts))
