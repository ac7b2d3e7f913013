"""The Chrome trace-event format, checked as Perfetto and chrome://tracing read it: every event has ``ph``
and ``pid``; a slice has ``ts`` and ``dur`` (or a matching B/E pair) and the slices of one thread nest;
metadata may have ``ts`` 0; one rank per process (named in its ``process_name``)."""

from __future__ import annotations

import re


def check_trace(doc: dict) -> dict:
    """Assert the format; returns {pid: rank} from the process names."""
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    per_thread: dict = {}
    open_b: dict = {}
    names: dict = {}
    for e in events:
        assert "ph" in e and "pid" in e, e
        ph = e["ph"]
        assert ph in ("X", "B", "E", "M", "i", "I"), e
        if ph == "M":
            assert e.get("ts", 0) == 0 and isinstance(e.get("args"), dict), e
            if e["name"] == "process_name":
                assert e["pid"] not in names, f"two names for pid {e['pid']}"
                names[e["pid"]] = e["args"]["name"]
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        key = (e["pid"], e.get("tid", 0))
        if ph == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            per_thread.setdefault(key, []).append((e["ts"], e["ts"] + e["dur"]))
        elif ph == "B":
            open_b.setdefault(key, []).append(e["ts"])
        elif ph == "E":
            assert open_b.get(key), f"E without B: {e}"
            per_thread.setdefault(key, []).append((open_b[key].pop(), e["ts"]))
    assert not any(open_b.values()), f"B without E: {open_b}"
    for key, slices in per_thread.items():
        stack: list = []
        for start, end in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and start >= stack[-1]:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, f"slices of {key} overlap without nesting: {start}..{end}"
            stack.append(end)
    used = {e["pid"] for e in events if e["ph"] != "M"}
    assert used <= set(names), f"processes without a name: {used - set(names)}"
    ranks = {}
    for pid, name in names.items():
        m = re.match(r"rank (\d+)\b", name)
        assert m, name
        ranks[pid] = int(m.group(1))
    assert len(set(ranks.values())) == len(ranks), f"a rank in two processes: {names}"
    return ranks
