"""The set of real logs from public issue threads (tests/data/explain_realworld, issue 25): its shape, the
judge's rules, and that the development half does not regress.

The held-out half is scored by ``python tests/data/explain_realworld/realworld_score.py --heldout``, once, when the
work for issue 25 is done; the test only checks that it is there, labelled and unchanged in size.
"""

from __future__ import annotations

import os
import re
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "explain_realworld"))

import realworld_score as score  # noqa: E402

CASES = score.load_cases()


def test_set_shape():
    assert len(CASES) >= 50
    assert len({c["source"] for c in CASES}) == len(CASES), "one log per thread"
    assert {c["added"] for c in CASES} <= {"first", "late"}
    halves = [c["half"] for c in CASES]
    assert set(halves) == {"dev", "heldout"} and abs(halves.count("dev") - halves.count("heldout")) <= 1
    for case in CASES:
        assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+", case["source"]), case
        assert re.fullmatch(r"[a-z0-9-]+", case["expect"]), case
        text = score.read_log(case)
        assert text.strip(), case["file"]
        assert not re.search(r"\b(?:\d{1,3}\.){3}\d{1,3}\b", text), f"{case['file']}: an address left in"


def test_no_thread_of_the_older_corpus():
    """The set measures explain on threads it was not written from (issue 25)."""
    old_table = os.path.join(os.path.dirname(os.path.abspath(__file__)), "explain_corpus", "cases.tsv")
    with open(old_table, encoding="utf-8") as f:
        old = {line.split("\t")[8].replace("#", "/") for line in f.read().splitlines()[1:]}
    ours = {re.sub(r"https://github\.com/|/(?:issues|pull)(?=/)", "", c["source"]) for c in CASES}
    assert not ours & old


def _m(cid, candidates=()):
    return SimpleNamespace(cause=SimpleNamespace(id=cid), candidates=candidates)


@pytest.mark.parametrize("outcome,matches", [
    ("unknown", []),
    ("right", [_m("a")]),
    ("right", [_m("peer-closed"), _m("a")]),
    ("right", [_m("fam", (("a", "how"), ("b", "how"), ("c", "how")))]),
    ("partial", [_m("fam", (("b", "how"), ("a", "how")))]),
    ("partial", [_m("b"), _m("a")]),
    ("wrong", [_m("b")]),
    ("unknown", [_m("fam", (("b", "how"), ("c", "how")))]),
])
def test_judge(outcome, matches):
    assert score.classify(score.named(matches), "a") == outcome


def test_a_family_of_more_than_three_is_not_right():
    fam = _m("fam", tuple((x, "how") for x in "abcd"))
    assert score.classify(score.named([fam]), "a") == "partial"


def test_the_development_half_holds():
    """The dev half was worked on: 24 of 25 right, none wrong when issue 25 closed; it may not fall."""
    results = score.run([c for c in CASES if c["half"] == "dev"])
    outcomes = [o for _, _, o in results]
    wrong = [(c["id"], found) for c, found, o in results if o == "wrong"]
    assert not wrong, wrong
    assert outcomes.count("right") >= 24, [(c["id"], o) for c, _, o in results if o != "right"]


def test_the_first_held_out_half_names_no_wrong_cause():
    """The first held-out half, seen since it was scored (19 right, 3 wrong): after the generic GPU messages
    became families it has none wrong (20 right, 4 partial, 1 unknown); it may not fall back."""
    results = score.run([c for c in CASES if c["half"] == "heldout"])
    wrong = [(c["id"], found) for c, found, o in results if o == "wrong"]
    assert not wrong, wrong
    assert [o for _, _, o in results].count("right") >= 20


SECOND = score.load_cases(os.path.join(os.path.dirname(score.__file__), "heldout2"))


def _keeps_its_score(cases: list, right: int, wrong_at_most=frozenset()) -> None:
    """A set's score may not fall: at least ``right`` right, and no case wrong beyond ``wrong_at_most``."""
    results = score.run(cases)
    wrong = {c["id"] for c, _, o in results if o == "wrong"}
    assert wrong <= set(wrong_at_most), sorted(wrong)
    assert [o for _, _, o in results].count("right") >= right, [(c["id"], o) for c, _, o in results if o != "right"]


def _assert_new_set(cases: list, earlier: list, added, loopback_ok: bool, half: str = "heldout", odd=None) -> None:
    """At least 25 real logs, one per thread, none from a thread of the ``earlier`` sets or of the older corpus (whose
    table writes its sources as owner/repo#N), each labelled (``added``: a name, or a tuple of names) and scrubbed of
    addresses (with ``loopback_ok``, loopback and 0.0.0.0 may stay: they name no one and are the evidence); ``odd``:
    True or False when the set takes only odd- or even-numbered threads (a blind set and a development set drawn at
    the same time)."""
    assert len(cases) >= 25
    sources = [c["source"] for c in cases]
    assert len(set(sources)) == len(sources), "one log per thread"
    assert not {s.lower() for s in sources} & {c["source"].lower() for c in earlier}
    old_table = os.path.join(os.path.dirname(os.path.abspath(__file__)), "explain_corpus", "cases.tsv")
    with open(old_table, encoding="utf-8") as f:
        old = {line.split("\t")[8].replace("#", "/").lower() for line in f.read().splitlines()[1:]}
    ours = {re.sub(r"https://github\.com/|/(?:issues|pull)(?=/)", "", s).lower() for s in sources}
    assert not ours & old
    names = (added,) if isinstance(added, str) else tuple(added)
    for case in cases:
        assert case["half"] == half and case["added"] in names, case
        assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+", case["source"]), case
        if odd is not None:
            assert int(case["source"].rsplit("/", 1)[1]) % 2 == (1 if odd else 0), case
        assert re.fullmatch(r"[a-z0-9-]+", case["expect"]), case
        text = score.read_log(case)
        text = _LOOPBACK_OR_ANY.sub("", text) if loopback_ok else text
        assert text.strip(), case["file"]
        assert not re.search(r"\b(?:\d{1,3}\.){3}\d{1,3}\b", text), f"{case['file']}: an address left in"


_LOOPBACK_OR_ANY = re.compile(r"\b(?:127\.\d{1,3}\.\d{1,3}\.\d{1,3}|0\.0\.0\.0)\b")


def test_second_heldout_set_is_new():
    """The second held-out set (issue 25, after the first held-out half was seen)."""
    _assert_new_set(SECOND, CASES, "heldout2", loopback_ok=False)


def test_the_second_held_out_set_keeps_its_score():
    """Scored once, after the generic GPU messages became families (RESULTS.md): 19 of 27 right, 1 partial,
    3 wrong (102, 109, 118), 4 unknown. Worked on after it was seen (whose port, the reducer's newer wording, the
    bare 'Tensors must be CUDA and dense' as a family, the driver's own message, nvidia-smi's table): 25 right,
    2 partial, none wrong. It may not fall back, and no case may become wrong."""
    _keeps_its_score(SECOND, right=25)


THIRD = score.load_cases(os.path.join(os.path.dirname(score.__file__), "heldout3"))


def test_third_heldout_set_is_new():
    """The third held-out set (issue 25, after heldout2 was seen)."""
    _assert_new_set(THIRD, CASES + SECOND, "heldout3", loopback_ok=True)


FOURTH = score.load_cases(os.path.join(os.path.dirname(score.__file__), "heldout4"))


def test_fourth_heldout_set_is_new():
    """The fourth held-out set (issue 25, after heldout3 was seen), scored once after the catalogue work of this
    round landed (see the score test below)."""
    _assert_new_set(FOURTH, CASES + SECOND + THIRD, "heldout4", loopback_ok=True)


def test_the_third_held_out_set_keeps_its_score():
    """Scored once, after the second set's misses became families (RESULTS.md): 18 of 27 right, 1 partial, 2 wrong
    (202, 218), 6 unknown: that is its held-out score. Fixed after it was seen (NCCL's shm_open permission WARN, SyncBN
    outside DDP, libuv's newer wording, a DataLoader worker that exited as a family): 22 right, 1 partial, none
    wrong; then 223 (an en dash in '–local_rank') and 227 ("cannot pickle 'dict_keys' object" through
    multiprocessing's pickler): 24 right. It may not fall back, and no case may become wrong."""
    _keeps_its_score(THIRD, right=24)


def test_the_fourth_held_out_set_keeps_its_score():
    """Scored once, after this round's catalogue work (RESULTS.md): 18 of 28 right (64.3%), 1 partial, 1 wrong (324:
    NCCL's bootstrap 'Message truncated', an NCCL 2.19.3 bug, named as a collective-size mismatch), 8 unknown (five
    of them causes no log line names: an NCCL release's bug, uneven inputs, a Lightning or accelerate bug, a
    notebook). Worked on after it was seen (explain6: NCCL's bootstrap truncation as a family with a sourced table of
    NCCL release bugs, ncclUnhandledCudaError as a family, uneven inputs, state_dict prefixes, Lightning's GPU index,
    accelerate with one process, notebooks, NCCL-not-built's source form): 24 right, 2 partial, none wrong. It may
    not fall back, and no case may become wrong."""
    _keeps_its_score(FOURTH, right=24)


FIFTH_DEV = score.load_cases(os.path.join(os.path.dirname(score.__file__), "dev5"))


def test_dev5_is_new_and_scrubbed():
    """dev5: a development set (even-numbered threads, so that a blind fifth held-out set can take the odd ones),
    new against every earlier set and the older corpus, labelled and scrubbed like the held-out sets."""
    assert len(FIFTH_DEV) >= 28
    _assert_new_set(FIFTH_DEV, CASES + SECOND + THIRD + FOURTH, ("dev5", "dev5-late"), loopback_ok=True, half="dev",
                    odd=False)


def test_dev5_keeps_its_score():
    """Scored before the catalogue changed for it (RESULTS.md): 9 of 23 right, 1 wrong (511: an NCCL graph/ WARN
    named as NCCL's generic warning), 13 unknown. After explain6's work on its classes: 23 right, none wrong. Five late
    threads (dev5-late), scored on that catalogue before any change for them: 1 right, 4 unknown; after their classes
    (descriptor passing, barrier's guessed GPU, NCCL's internal error as a family): 27 of 28 right, 1 partial (529)."""
    _keeps_its_score(FIFTH_DEV, right=27)


FIFTH = score.load_cases(os.path.join(os.path.dirname(score.__file__), "heldout5"))


def test_fifth_heldout_set_is_new():
    """The fifth held-out set (issue 25): odd-numbered threads only (dev5 took the even ones at the same time), new
    against every earlier set and the older corpus in both of its source forms."""
    _assert_new_set(FIFTH, CASES + SECOND + THIRD + FOURTH + FIFTH_DEV, "heldout5", loopback_ok=True, odd=True)


def test_the_fifth_held_out_set_keeps_its_score():
    """Scored once, after cppmine's and explain6's catalogue work (RESULTS.md): 16 of 31 right (51.6%), 1 partial,
    2 wrong (414: a DataLoader worker 'killed by signal: Killed' named host-oom; 422: the C10d store's connect()
    timeout named rendezvous-unreachable where the node's hostname did not resolve), 12 unknown. Worked on after it
    was seen (explain7: a SIGKILLed DataLoader worker and the store's connect timeout as families, the fragments users
    quote: tensors on two devices, a bare 'LOCAL_RANK', 'return code=-7', accelerate's 8-bit wording, the DataLoader's
    shm message, NCCL 1.x): 22 right, 3 partial (414, 422, 438), none wrong, 6 unknown. It may not fall back, and no
    case may become wrong."""
    _keeps_its_score(FIFTH, right=22)
