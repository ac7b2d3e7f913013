"""Which of the emitters' templates (``templates.tsv``, written by ``extract.py``) the cause catalogue covers.

A template is covered when some pattern of some cause in :data:`ddpdoctor.causes.catalogue.CAUSES` finds
it as a log shows it: its ``{}`` filled in (a number, a word or a path: any of the three), an NCCL
``WARN`` in NCCL's own line form (``host:pid:tid [dev] transport/nvls.cc:123 NCCL WARN message``), and torch's
C++ messages as c10d prints them (an exception with its "Exception raised from ... FILE:LINE" line, a
``[W... FILE:LINE] Warning:`` or ``[E... FILE:LINE]`` line: :func:`cpp_log_of`).

    python tests/data/emitters/coverage.py            # coverage per emitter
    python tests/data/emitters/coverage.py --missed nccl   # the templates of one emitter not covered
"""

from __future__ import annotations

import csv
import os
import re
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "templates.tsv")
FILLS = ("1", "x", "/tmp/x")


def load() -> list:
    with open(TEMPLATES, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def shown(row: dict) -> list:
    """The lines a log shows for one template (one per fill)."""
    texts = [row["template"].replace("{}", fill) for fill in FILLS]
    if row["emitter"] == "nccl" and row["file"].startswith("src/") and "(ncclGetErrorString)" not in row["file"]:
        where = row["file"][len("src/"):]  # NCCL prints its file relative to src/
        texts = [f"host:1:2 [0] {where}:1 NCCL WARN {t}" for t in texts]
    elif row["emitter"] == "gloo":  # GLOO_ENFORCE: "[enforce fail at FILE:LINE] cond. msg"; the rest "[FILE:LINE] msg"
        where = f"../third_party/gloo/{row['file']}:1"
        texts = [form for t in texts for form in (f"[enforce fail at {where}] x. {t}", f"[{where}] {t}")]
    return texts


_CPP_KINDS = {"(TORCH_WARN)": "warn", "(LOG ERROR)": "E", "(LOG WARNING)": "W", "(C10D_ERROR)": "c10d-E",
              "(C10D_WARNING)": "c10d-W"}


def cpp_log_of(row: dict, fill: str = "x") -> str:
    """A torch C++ (c10d) message as a log shows it, from the rank that printed it (``[rank0]:``): an exception
    is its message then "Exception raised from FUNC at ../torch/csrc/distributed/c10d/FILE:LINE (most recent
    call first):" and the first frame; TORCH_WARN is "[W1125 ... FILE:LINE] Warning: MSG (function FUNC)";
    LOG(ERROR/WARNING) is "[E1125 ... FILE:LINE] MSG" (C10D_ERROR/C10D_WARNING add "[c10d] ")."""
    path, _, kind = row["file"].partition(" ")
    name = path.rsplit("/", 1)[-1]
    msg = row["template"].replace("{}", fill)
    kind = _CPP_KINDS.get(kind, "raise")
    stamp = "1125 02:26:31.059000000 24546"
    if kind == "warn":
        return f"[rank0]:[W{stamp} {name}:1] Warning: {msg} (function f)\n"
    if kind != "raise":
        level, c10d = kind[-1], "[c10d] " if kind.startswith("c10d") else ""
        return f"[rank0]:[{level}{stamp} {name}:1] {c10d}{msg}\n"
    return (f"[rank0]: RuntimeError: {msg}\n"
            f"[rank0]: Exception raised from f at ../{path}:1 (most recent call first):\n"
            "[rank0]: frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x1 (0x1 in "
            "/opt/venv/lib/python3.11/site-packages/torch/lib/libc10.so)\n")


def traceback_of(row: dict) -> str:
    """A Python emitter's message as a log shows it: the end of the traceback that raised it."""
    site = "/opt/venv/lib/python3.11/site-packages/"
    path = row["file"][len("src/"):] if row["file"].startswith("src/") else row["file"]
    return (f'Traceback (most recent call last):\n  File "/work/train.py", line 1, in main\n    run()\n'
            f'  File "{site}{path}", line 1, in f\n    raise RuntimeError(msg)\n'
            f"RuntimeError: {row['template'].replace('{}', 'x')}\n")


def covering(row: dict, compiled: list, skip: frozenset = frozenset()):
    """The id of the first cause that finds the template as a log shows it, or None: a pattern on its
    line, or, for a Python emitter (torch, accelerate), explain reading the traceback that raised it.
    ``skip``: cause ids not to count."""
    if row["emitter"] in ("torch", "accelerate", "torch-cpp"):
        from ddpdoctor.causes.matcher import explain_text

        logs = [cpp_log_of(row, f) for f in FILLS] if row["emitter"] == "torch-cpp" else [traceback_of(row)]
        for log in logs:
            found = [m.cause.id for m in explain_text(log) if m.cause.id not in skip]
            if found:
                return found[0]
    texts = shown(row)
    for cid, pattern in compiled:
        if any(pattern.search(t) for t in texts):
            return cid
    return None


def measure(rows=None, causes=None, specific: bool = False) -> dict:
    """{emitter: (covered, total, versions)}, the versions comma-separated; ``specific``: count only causes that are not a family by
    source file (evidence.AREA)."""
    if causes is None:
        from ddpdoctor.causes.catalogue import CAUSES as causes
    from ddpdoctor.causes.evidence import AREA

    skip = frozenset(AREA) if specific else frozenset()
    compiled = [(c.id, re.compile(p)) for c in causes for p in c.patterns if c.id not in skip]
    out: dict = {}
    for row in rows if rows is not None else load():
        hit = covering(row, compiled, skip) is not None
        covered, total, versions = out.get(row["emitter"], (0, 0, row["version"]))
        if row["version"] not in versions.split(", "):
            versions += ", " + row["version"]
        out[row["emitter"]] = (covered + hit, total + 1, versions)
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--missed" in argv:
        from ddpdoctor.causes.catalogue import CAUSES

        emitter = argv[argv.index("--missed") + 1]
        compiled = [(c.id, re.compile(p)) for c in CAUSES for p in c.patterns]
        files = Counter()
        for row in load():
            if row["emitter"] == emitter and covering(row, compiled) is None:
                files[row["file"]] += 1
                print(f"{row['file']}: {row['template'][:160]}")
        return 0
    exact = measure(specific=True)
    for emitter, (covered, total, version) in sorted(measure().items()):
        version = version if "," not in version else f"{version.count(',') + 1} versions"
        print(f"{emitter:<11} {version:<14} {covered:>4} of {total:>4} templates covered ({100.0 * covered / total:.1f}%); "
              f"by a specific cause {exact[emitter][0]} ({100.0 * exact[emitter][0] / total:.1f}%)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
    raise SystemExit(main())
