"""README.md stays true: its set-up commands are what CI runs, and its sample report is what we print."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def _setup_commands() -> list[str]:
    section = _readme().split("## Set up", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_exactly_two_setup_commands_and_ci_runs_the_test_one():
    commands = _setup_commands()
    assert len(commands) == 2
    assert commands[0].endswith("ddpdoctor check")
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = f.read()
    assert commands[1] in ci.splitlines()
    assert f"{{ {commands[0]}; }}" in ci  # the first command, verbatim, its exit code and output checked
    assert "torch==2.13.0" in ci
    # ... inside a fresh virtual environment that cannot see the system's packages (numpy among them).
    assert "-m venv" in ci and "system-site-packages" not in ci and "/bin/activate" in ci
    assert ci.index("/bin/activate") < ci.index(commands[0]) < ci.index(commands[1])


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_sample_report_matches_a_real_run(cli_env):
    p = subprocess.run([sys.executable, "-m", "ddpdoctor", "check"], env=cli_env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    sample = re.search(r"\$ ddpdoctor check\n(.*?)```", _readme(), re.S).group(1).splitlines()
    real = p.stdout.splitlines()

    def shape(line: str) -> list[str]:
        return re.sub(r"[\d.]+", "N", line).split()[:3]

    assert [shape(x) for x in sample] == [shape(x) for x in real]


def test_exit_codes_table_matches_the_code():
    from ddpdoctor.exitcodes import ExitCode

    table = re.findall(r"^\| (\d+) \|", _readme().split("### Exit codes", 1)[1].split("###", 1)[0], re.M)
    assert [int(c) for c in table] == sorted(int(c) for c in ExitCode)


def test_every_check_is_documented():
    from ddpdoctor.runner.registry import all_checks

    text = _readme()
    for check in all_checks():
        assert f"| `{check.name}` |" in text, check.name


def test_every_test_the_reliability_section_names_exists():
    """Each promise in "Reliability" names the test that keeps it: that test must exist, by file and name."""
    section = _readme().split("## Reliability", 1)[1].split("\n## ", 1)[0]
    named, last_file = [], None
    for file, name in re.findall(r"`(?:(test_\w+\.py|conftest\.py))?(?:::)?(\w*)`", section):
        if file:
            last_file = file
        if name and last_file and (name.startswith("test_") or file):
            named.append((last_file, name))
    assert len(named) >= 30, named
    missing = []
    for file, name in named:
        if file == "conftest.py":
            continue
        with open(os.path.join(ROOT, "tests", file)) as f:
            if not re.search(rf"^def {re.escape(name)}\(", f.read(), re.M):
                missing.append(f"{file}::{name}")
    assert not missing, missing
