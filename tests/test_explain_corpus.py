"""``explain`` on the corpus of real failures (tests/explain_corpus): no case that was right regresses,
and no case names a wrong cause.

The baseline (tests/explain_corpus/baseline.json) lists the cases that are right; rewrite it with
``python tests/explain_corpus/score.py --write-baseline`` after a change that makes more cases right.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "explain_corpus"))

import score

CASES = score.load_cases()
with open(score.BASELINE, encoding="utf-8") as _f:
    BASELINE = json.load(_f)


@pytest.fixture(scope="module")
def results():
    return {case["id"]: (found, outcome) for case, found, outcome in score.run(CASES)}


def test_corpus_shape():
    assert len(CASES) >= 110
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids))
    held = [c for c in CASES if c["heldout"]]
    assert [c["id"] for c in held] == [c["id"] for c in CASES if int(c["id"]) % 5 == 0 and not c["late"]]
    late = [int(c["id"]) for c in CASES if c["late"]]
    assert late and late == list(range(late[0], len(CASES) + 1))  # appended after the freeze, never held out
    kinds = {c["kind"] for c in CASES}
    assert {"version", "network", "launch", "ddp-cuda", "memory", "timeout"} <= kinds
    for case in CASES:
        assert os.path.getsize(os.path.join(score.CASES_DIR, case["file"])) > 0, case["file"]
        assert case["source"].count("/") == 1 and "#" in case["source"], case["source"]
        assert case["fix"] and case["expect"]


@pytest.mark.parametrize("outcome,found,case", [
    ("unknown", [], {"expect": "a", "alt": set(), "related": set()}),
    ("right", ["a"], {"expect": "a", "alt": set(), "related": set()}),
    ("right", ["b", "peer-closed"], {"expect": "a", "alt": {"b"}, "related": set()}),
    ("right", ["s", "a"], {"expect": "a", "alt": set(), "related": {"s"}}),
    ("partial", ["s"], {"expect": "a", "alt": set(), "related": {"s"}}),
    ("wrong", ["a", "x"], {"expect": "a", "alt": set(), "related": set()}),
    ("wrong", ["x"], {"expect": "a", "alt": set(), "related": set()}),
])
def test_classify_rules(outcome, found, case):
    assert score.classify(found, case) == outcome


def test_no_right_case_regresses(results):
    lost = {cid: results[cid] for cid in BASELINE["right"] if results[cid][1] != "right"}
    assert not lost, f"cases that were right and are not any more: {lost}"


def test_no_case_is_wrong(results):
    wrong = {cid: r[0] for cid, r in results.items() if r[1] == "wrong" and cid not in BASELINE["known_wrong"]}
    assert not wrong, f"cases where explain names a cause the thread did not settle: {wrong}"


def test_baseline_is_current(results):
    """The baseline claims no more than is true, so docs/explain.md's score is the measured one."""
    right = sorted(cid for cid, r in results.items() if r[1] == "right")
    assert BASELINE["right"] == right, "rerun: python tests/explain_corpus/score.py --write-baseline"


def test_score_script_prints_the_table(capsys):
    assert score.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("all cases") and "held-out fifth" in out



def test_readme_states_the_measured_score(results):
    """docs/explain.md's score line is the one this corpus gives today."""
    with open(os.path.join(os.path.dirname(score.HERE), os.pardir, "docs", "explain.md"), encoding="utf-8") as f:
        readme = " ".join(f.read().split())
    outcomes = list(results.values())
    right = sum(1 for _, o in outcomes if o == "right")
    late = [results[c["id"]][1] for c in CASES if c["late"]]
    held = [results[c["id"]][1] for c in CASES if c["heldout"]]
    assert f"Score: {right} of {len(CASES)} cases right ({100.0 * right / len(CASES):.1f}%), none wrong" in readme
    assert f"{held.count('right')} of {len(held)} right" in readme
    assert f"{late.count('right')} of {len(late)} right ({100.0 * late.count('right') / len(late):.1f}%)" in readme
