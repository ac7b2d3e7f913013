"""README.md and docs/ stay true: the set-up commands are what CI runs, the exit-code table and the list of
checks are the code's, and docs/reliability.md names only tests that exist (the sample reports: test_docs.py)."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def _page(name: str) -> str:
    with open(os.path.join(ROOT, "docs", name), encoding="utf-8") as f:
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


def test_exit_codes_table_matches_the_code():
    from ddpdoctor.exitcodes import ExitCode

    table = re.findall(r"^\| (\d+) \|", _page("checks.md").split("### Exit codes", 1)[1].split("###", 1)[0], re.M)
    assert [int(c) for c in table] == sorted(int(c) for c in ExitCode)


def test_every_check_is_documented():
    from ddpdoctor.runner.registry import all_checks

    text = _page("checks.md")
    for check in all_checks():
        assert f"| `{check.name}` |" in text, check.name


def test_every_test_the_reliability_section_names_exists():
    """Each promise in docs/reliability.md names the test that keeps it: that test must exist, by file and name."""
    section = _page("reliability.md").split("## The promises", 1)[1].split("\n## ", 1)[0]
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
