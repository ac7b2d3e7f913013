"""Score ``ddpdoctor explain`` on the corpus: right / partial / wrong / unknown for every case.

    python tests/explain_corpus/score.py              # the table: all cases, the held-out fifth, the late
                                                      # cases (written after the catalogue froze), per kind
    python tests/explain_corpus/score.py --cases      # one line per case
    python tests/explain_corpus/score.py --write-baseline   # record which cases are right now

Rules (issue 17), applied to the causes ``explain_text`` names for a log:

- right: the case's cause (or an equivalent listed in ``alt``) is named, and every other cause named is
  one the table lists as a related consequence (``related``) or ``peer-closed`` (a rank that lost its
  peer is a consequence in every case);
- partial: only related symptoms are named, not the cause;
- wrong: some cause that is neither the case's cause, an equivalent nor a related symptom is named;
- unknown: nothing is named ("no known cause").
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(HERE, "cases.tsv")
CASES_DIR = os.path.join(HERE, "cases")
BASELINE = os.path.join(HERE, "baseline.json")
ALWAYS_RELATED = {"peer-closed"}
OUTCOMES = ("right", "partial", "wrong", "unknown")


def _explain_text():
    try:
        from ddpdoctor.causes.matcher import (
            explain_text,  # after the layout move (issue 11)
        )
    except ImportError:
        from ddpdoctor.explain import explain_text
    return explain_text


def load_cases() -> list:
    with open(TABLE, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    for row in rows:
        row["alt"] = {a for a in row["alt"].split(",") if a}
        row["related"] = {a for a in row["related"].split(",") if a}
        row["late"] = row["heldout"] == "late"
        row["heldout"] = row["heldout"] == "yes"
    return rows


def read_log(case: dict) -> str:
    with open(os.path.join(CASES_DIR, case["file"]), encoding="utf-8") as f:
        return f.read()


def classify(found: list, case: dict) -> str:
    """right / partial / wrong / unknown for the cause ids ``found`` (in the order explain named them)."""
    if not found:
        return "unknown"
    ok = {case["expect"]} | case["alt"]
    related = case["related"] | ALWAYS_RELATED
    if any(f not in ok and f not in related for f in found):
        return "wrong"
    return "right" if any(f in ok for f in found) else "partial"


def run(cases=None) -> list:
    """(case, found ids, outcome) for every case."""
    explain_text = _explain_text()
    out = []
    for case in cases if cases is not None else load_cases():
        found = [m.cause.id for m in explain_text(read_log(case))]
        out.append((case, found, classify(found, case)))
    return out


def _pct(n: int, d: int) -> str:
    return f"{100.0 * n / d:5.1f}%" if d else "   n/a"


def table(results: list) -> list:
    """The score lines: all cases, the held-out fifth, the rest, then per kind and per launcher."""
    def line(name, rs):
        c = Counter(o for _, _, o in rs)
        return (f"{name:<22} {len(rs):>4}  right {c['right']:>3} {_pct(c['right'], len(rs))}  partial {c['partial']:>3}"
                f"  wrong {c['wrong']:>3}  unknown {c['unknown']:>3}")
    lines = [line("all cases", results),
             line("held-out fifth", [r for r in results if r[0]["heldout"]]),
             line("written-for (4/5)", [r for r in results if not r[0]["heldout"] and not r[0]["late"]]),
             line("late (after freeze)", [r for r in results if r[0]["late"]]), ""]
    for key in ("kind", "launcher"):
        groups = defaultdict(list)
        for r in results:
            groups[r[0][key]].append(r)
        for name in sorted(groups):
            lines.append(line(f"{key} {name}", groups[name]))
        lines.append("")
    return lines


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    results = run()
    if "--cases" in argv:
        for case, found, outcome in results:
            mark = "H" if case["heldout"] else "L" if case["late"] else " "
            print(f"{case['id']} {mark} {outcome:<8} expect {case['expect']:<26} found {','.join(found) or '-'}")
        print()
    print("\n".join(table(results)).rstrip())
    if "--write-baseline" in argv:
        data = {"right": sorted(c["id"] for c, _, o in results if o == "right"),
                "known_wrong": sorted(c["id"] for c, _, o in results if o == "wrong")}
        with open(BASELINE, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        print(f"\nwrote {os.path.relpath(BASELINE)}: {len(data['right'])} right, {len(data['known_wrong'])} known wrong")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    raise SystemExit(main())
