"""Score ``ddpdoctor explain`` on real logs from public issue threads (issue 25), by the issue's judge.

    python tests/data/explain_realworld/realworld_score.py            # the table: each half, then per kind
    python tests/data/explain_realworld/realworld_score.py --cases    # one line per case
    python tests/data/explain_realworld/realworld_score.py --heldout  # include the held-out half (score it once, at the end)
    python tests/data/explain_realworld/realworld_score.py --set heldout2   # the second held-out set (heldout2/)
    python tests/data/explain_realworld/realworld_score.py --set heldout3   # the third held-out set (heldout3/)
    python tests/data/explain_realworld/realworld_score.py --set heldout5   # the fifth held-out set (heldout5/; heldout4/ likewise)

The logs (``logs/``) are what users pasted in the thread named in ``cases.tsv`` (user names, hosts,
addresses removed), picked by searching for the symptom; ``expect`` is the cause the thread settled.
The set was split at random (``random.Random(25)``) into a development half and a held-out half, and
committed with its labels before the catalogue changed for it. Ten threads of the first draw turned out
to be in the older corpus (tests/explain_corpus) and were dropped; seven new threads (``added`` = late)
replaced them, split with the same seed, labelled from their threads after the catalogue had changed.

Judge (issue 25), on the causes ``explain_text`` names, in order (``peer-closed``, a consequence in
every case, is left out unless nothing else is named; a family counts as its candidates, in rank order):

- right: the settled cause is the single cause named first, or the first candidate of a family of at
  most 3 (each candidate saying how to tell it apart);
- partial: the settled cause is named, but not first;
- wrong: a different single cause is stated with confidence (not a family);
- unknown: nothing named, or only families that do not hold the settled cause.
"""

from __future__ import annotations

import csv
import os
import sys
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(HERE, "cases.tsv")
LOGS = os.path.join(HERE, "logs")
CONSEQUENCES = {"peer-closed"}
OUTCOMES = ("right", "partial", "wrong", "unknown")


def load_cases(where: str = HERE) -> list:
    """The cases of the set in ``where`` (this folder, or a later held-out set such as ``heldout2/``)."""
    with open(os.path.join(where, "cases.tsv"), encoding="utf-8", newline="") as f:
        cases = list(csv.DictReader(f, delimiter="\t"))
    for case in cases:
        case["_logs"] = os.path.join(where, "logs")
    return cases


def read_log(case: dict) -> str:
    with open(os.path.join(case.get("_logs", LOGS), case["file"]), encoding="utf-8") as f:
        return f.read()


def named(matches) -> list:
    """[(ids, is_family)] for the matches, in order: a family's candidate ids in rank order, or the one id."""
    out = []
    for m in matches:
        family = tuple(getattr(m, "candidates", ()) or ())
        out.append(([c[0] for c in family], True) if family else ([m.cause.id], False))
    kept = [n for n in out if not (not n[1] and n[0][0] in CONSEQUENCES)]
    return kept or out


def classify(found: list, expect: str) -> str:
    """right / partial / wrong / unknown for ``found`` (as :func:`named` gives it) and the settled cause."""
    if not found:
        return "unknown"
    ids, family = found[0]
    if ids and ids[0] == expect and (not family or len(ids) <= 3):
        return "right"
    if any(expect in i for i, _ in found):
        return "partial"
    return "unknown" if all(f for _, f in found) else "wrong"


def run(cases=None) -> list:
    """(case, found, outcome) for every case."""
    from ddpdoctor.causes.matcher import explain_text

    out = []
    for case in cases if cases is not None else load_cases():
        found = named(explain_text(read_log(case)))
        out.append((case, found, classify(found, case["expect"])))
    return out


def _line(name: str, rs: list) -> str:
    c = Counter(o for _, _, o in rs)
    pct = f"{100.0 * c['right'] / len(rs):5.1f}%" if rs else "   n/a"
    return (f"{name:<18} {len(rs):>3}  right {c['right']:>2} {pct}  partial {c['partial']:>2}  wrong {c['wrong']:>2}"
            f"  unknown {c['unknown']:>2}")


def table(results: list, heldout: bool) -> list:
    halves = ("dev", "heldout") if heldout else ("dev",)
    lines = [_line(f"{h} half", [r for r in results if r[0]["half"] == h]) for h in halves
             if any(r[0]["half"] == h for r in results)]
    groups = defaultdict(list)
    for r in results:
        if r[0]["half"] in halves:
            groups[r[0]["kind"]].append(r)
    return lines + [""] + [_line(f"kind {k}", groups[k]) for k in sorted(groups)]


def _show(found: list) -> str:
    return " ".join(("(" + "|".join(ids) + ")") if fam else ids[0] for ids, fam in found) or "-"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    heldout = "--heldout" in argv
    if "--set" in argv:
        name = argv[argv.index("--set") + 1] if argv.index("--set") + 1 < len(argv) else ""
        where = os.path.join(HERE, name)
        if not name or not os.path.isfile(os.path.join(where, "cases.tsv")):
            print(f"realworld_score: no set {name!r} here (a folder of {HERE} with cases.tsv); try --set heldout2",
                  file=sys.stderr)
            return 2
        cases, heldout = load_cases(where), True
    else:
        cases = [c for c in load_cases() if heldout or c["half"] == "dev"]
    results = run(cases)
    if "--cases" in argv:
        for case, found, outcome in results:
            print(f"{case['id']} {case['half']:<7} {outcome:<7} expect {case['expect']:<26} found {_show(found)}")
        print()
    print("\n".join(table(results, heldout)))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
    raise SystemExit(main())
