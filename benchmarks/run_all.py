"""Run every benchmark script (quick settings by default) and print one table: what, ratio, target, met?

Each script still measures its subject against a baseline in its own run (see its docstring); this
runs them one after another, reads the figures they print and puts them in one Markdown table with
the machine, the torch version and the load average (the README's Speed section is this output).
On a shared machine the ratios are noisy: re-measure on a quiet one before trusting a single row.

Not run here: fault_matrix.py (it breaks jobs on purpose and needs root for its multi-host rows:
its table is separate). A GPU is not used: every row is CPU, gloo.

Usage: python benchmarks/run_all.py [--full] [--only check,scale,...]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

Row = tuple[str, str, str, str]  # what, measured (ratio), target, met?


def _met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _check(out: str) -> list[Row]:
    rows = []
    for m in re.finditer(r"^(default|control)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+<= ([\d.]+)x"
                         r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", out, re.M):
        subject, n, floor, check, ratio, target, _, _, cpu = m.groups()
        what = ("`ddpdoctor check` (every default check)" if subject == "default"
                else "`ddpdoctor check --only env,port,process-group`")
        rows.append((f"{what} vs the fork floor, {n} ranks", f"{check} s vs {floor} s: **{ratio}x** (CPU {cpu}x)",
                     f"<= {target}x", _met(float(ratio) <= float(target))))
    return rows


def _scale(out: str) -> list[Row]:
    rows = []
    found = re.findall(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+(-|[\d.-]+)\s+([\d.]+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s*$",
                       out, re.M)
    if found:
        msgs = {int(n): float(m) for n, _, _, _, m, _, _, _ in found}
        sizes = sorted(msgs)
        text = ", ".join(f"{n}: {msgs[n]:g}" for n in sizes)
        rows.append((f"control-store messages per rank at {', '.join(map(str, sizes))} ranks (env, port, "
                     "process-group and the runner's; writes and reads)", text, "constant in N",
                     _met(len(set(msgs.values())) == 1)))
        waits = ", ".join(f"{int(n)}: {float(w):g}" for n, _, _, _, _, _, w, _ in found)
        rows.append(("a rank's waits for its next directive (one per second waited)", waits, "-", "-"))
        sup = ", ".join(f"{int(n)}: {float(s):.0f}" for n, _, _, _, _, _, _, s in found)
        rows.append(("supervisor's own store messages per rank (polling)", sup, "not growing with N",
                     _met(all(float(b[7]) <= float(a[7]) * 1.5 for a, b in zip(found, found[1:])))))
        times = ", ".join(f"{int(n)}: {float(w):.2f} s" + ("" if a == "-" else f" (+{float(a) * 1000:.0f} ms/rank)")
                          for n, _, w, a, _, _, _, _ in found)
        floors = ", ".join(f"{int(n)}: {float(f):.2f} s" for n, f, _, _, _, _, _, _ in found)
        rows.append(("control plane wall time by ranks (time per rank added)", f"{times}; floor {floors}", "-", "-"))
    for m in re.finditer(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+x|-)\s+(-|[\d.-]+)\s+([\d.]+|nan)\s+([\d.]+|-)\s+"
                         r"([\d.]+|nan)x\s+exit (\d+): (.*)$", out, re.M):
        n, wall, ratio, added, msgs, pss, scale, rc, last = m.groups()
        extra = [f"{ratio} the floor" if ratio != "-" else "",
                 f"+{float(added) * 1000:.0f} ms/rank" if added != "-" else "",
                 f"{msgs} store messages/rank", f"{pss} MiB/rank (PSS)" if pss != "-" else "",
                 f"deadline scaled {scale}x" if scale not in ("1.0", "nan") else ""]
        rows.append((f"every default check at {n} ranks", f"{wall} s ({', '.join(e for e in extra if e)}), "
                     f"{last.strip()}", "passes, no timeout", _met(rc == "0")))
    return rows


def _collectives(out: str) -> list[Row]:
    rows = []
    for m in re.finditer(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\S+\s+0\.9-1\.1", out, re.M):
        size, _, _, ratio = m.groups()
        rows.append((f"collectives check's all_reduce busbw vs a plain loop, {int(size) >> 10} KiB",
                     f"**{ratio}**", "0.9-1.1", _met(0.9 <= float(ratio) <= 1.1)))
    m = re.search(r"without collectives ([\d.]+) s, with ([\d.]+) s, added ([-\d.]+) s", out)
    if m:
        rows.append(("time the default collectives check adds (2 ranks)", f"{m.group(2)} s vs {m.group(1)} s: "
                     f"**+{float(m.group(3)):.2f} s**", "<= 1 s", _met(float(m.group(3)) <= 1.0)))
    return rows


def _gather(out: str) -> list[Row]:
    rows = []
    for m in re.finditer(r"^(.*?): dist\.all_gather\(padded\) ([\d.]+) ms.*?gather\(uneven\) ([\d.]+) ms; "
                         r"ratio ([\d.]+)x vs all_gather \((OK|OVER) at limit ([\d.]+)x\)", out, re.M):
        label, plain, ours, ratio, verdict, limit = m.groups()
        rows.append((f"`gather` of uneven shards vs `all_gather` of the padded size, {label.strip()}",
                     f"{ours} ms vs {plain} ms: **{ratio}x**", f"<= {limit}x", _met(verdict == "OK")))
    return rows


def _fingerprint(out: str) -> list[Row]:
    rows = []
    model = re.search(r"model: ([\d.]+M) parameters in (\d+) tensors", out)
    shape = f" ({model.group(1)} parameters, {model.group(2)} tensors, CPU)" if model else ""
    for m in re.finditer(r"^(fp32|bf16):\s+assert_in_sync\(model\): ([\d.]+) ms, ([\d.]+)x the floor "
                         r"\(target <= ([\d.]+)x\)", out, re.M):
        dtype, ms, ratio, target = m.groups()
        rows.append((f"`assert_in_sync` vs one sum over the same bytes, {dtype}{shape}", f"{ms} ms: **{ratio}x**",
                     f"<= {target}x", _met(float(ratio) <= float(target))))
    m = re.search(r"bytes sent per rank: (\d+) in (\d+) collectives", out)
    if m:
        rows.append(("bytes `assert_in_sync` sends per rank (in sync)", f"{m.group(1)} bytes in {m.group(2)} "
                     "collective(s)", "grows with tensors, not parameters", "yes"))
    m = re.search(r"time ratio: ([\d.]+)x \(target <= ([\d.]+)x\)", out)  # the script's older output
    if m and not rows:
        rows.append(("`assert_in_sync` vs one local sum over the parameters", f"**{m.group(1)}x**",
                     f"<= {m.group(2)}x", _met(float(m.group(1)) <= float(m.group(2)))))
    return rows


def _jobrun(out: str) -> list[Row]:
    rows = []
    m = re.search(r"overhead: wall ([+-][\d.]+)%, training loop ([+-][\d.]+)%", out)
    if m:
        rows.append(("`ddpdoctor run` around torchrun of a 2-rank, 200-step DDP loop (wall)",
                     f"**{m.group(1)}%** (the loop itself {m.group(2)}%)", "<= 2%", _met(float(m.group(1)) <= 2.0)))
    m = re.search(r"paired: median of the (\d+) pairs' wall ratios ([+-][\d.]+)%", out)
    if m:
        rows.append((f"the same, median of {m.group(1)} back-to-back pairs' ratios", f"**{m.group(2)}%**", "<= 2%",
                     _met(float(m.group(2)) <= 2.0)))
    m = re.search(r"fixed cost around `python -c pass`: median (\d+) ms", out)
    if m:
        rows.append(("`ddpdoctor run`'s own start and end (around `python -c pass`)", f"{m.group(1)} ms", "-", "-"))
    m = re.search(r"hang to verdict: (.*?) s with --hang-timeout ([\d.]+)", out)
    if m:
        rows.append((f"from a hang to the verdict, --hang-timeout {m.group(2)}", f"{m.group(1)} s", "-", "-"))
    return rows


# name -> (script, quick args, full args, parser)
BENCHES: dict[str, tuple[str, list, list, Callable[[str], list[Row]]]] = {
    "check": ("bench_check.py", ["--repeat", "3"], ["--repeat", "7"], _check),
    "scale": ("bench_scale.py", ["--ranks", "2", "8", "32", "128", "--repeat", "1", "--default"],
              ["--ranks", "2", "8", "32", "128", "--repeat", "3", "--default"], _scale),
    "collectives": ("bench_collectives.py", ["--rounds", "5", "--repeat", "3"], [], _collectives),
    "gather": ("bench_gather.py", ["--repeat", "10"], [], _gather),
    "fingerprint": ("bench_assert_in_sync.py", ["--repeat", "5"], [], _fingerprint),
    "jobrun": ("bench_jobrun.py", ["--repeat", "3"], [], _jobrun),
}


def _machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, Linux {platform.release()}, Python {platform.python_version()}, torch {torch.__version__}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="each script's full settings (slow)")
    ap.add_argument("--only", default=",".join(BENCHES), help="comma-separated: " + ", ".join(BENCHES))
    args = ap.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    bad = [n for n in names if n not in BENCHES]
    if bad:
        raise SystemExit(f"--only {','.join(bad)}: unknown; choose from {', '.join(BENCHES)}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    rows: list[Row] = []
    load0 = os.getloadavg()
    started = time.monotonic()
    for name in names:
        script, quick, full, parse = BENCHES[name]
        cmd = [sys.executable, os.path.join(HERE, script), *(full if args.full else quick)]
        print(f"running {' '.join(cmd[1:])} ...", file=sys.stderr, flush=True)
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=HERE)
        print(p.stdout, file=sys.stderr, flush=True)
        found = parse(p.stdout)
        if not found:
            found = [(f"{script}", f"no figures (exit {p.returncode}): see its output above", "-", "**no**")]
        rows += found
    print(f"Machine: {_machine()}; load average {load0[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end "
          f"({time.monotonic() - started:.0f} s; {'full' if args.full else 'quick'} settings).\n")
    print("| what | measured (ratio) | target | met? |")
    print("|---|---|---|---|")
    for what, measured, target, met in rows:
        print(f"| {what} | {measured} | {target} | {met} |")


if __name__ == "__main__":
    main()
