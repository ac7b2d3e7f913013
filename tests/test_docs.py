"""Every command and code block in README.md and docs/*.md is run or parsed by a test, and every relative
link and anchor between the pages resolves (read from the files: no network).

Each fenced block is matched to one entry of ``BLOCKS`` by its language and a piece of its text; the entry
says how the block is kept true:

- ``real:NAME``: run here, for real, by the test named in ``REAL`` (it compares the block with what the
  command printed);
- ``test:FILE::NAME``: produced or run by that test of the suite (which must exist, by file and name).

On top of that, every block is checked by what it is: each ``ddpdoctor`` command in it (after ``$``, in a
bash script, behind ``srun``/``torchrun -m``/``mpirun``, in a Kubernetes command) is parsed by the CLI
itself (options, types, ranges: a renamed option fails here), bash blocks go through ``bash -n``, Python
blocks are compiled, and the architecture tree names only modules that exist. A block that appears on two
pages matches one entry and runs once. A new block with no entry fails
``test_every_block_is_accounted_for``: add its entry, with a test that runs it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
QUIET = "ignore:Failed to initialize NumPy"  # torch's own import-time note on a CPU wheel without numpy


class Block(NamedTuple):
    page: str
    line: int
    lang: str
    text: str


def _blocks() -> list[Block]:
    """Every fenced block of every page, its indentation (a block inside a list item) removed."""
    found = []
    for path in PAGES:
        lines = path.read_text(encoding="utf-8").split("\n")
        i = 0
        while i < len(lines):
            m = re.match(r"^( *)```(\S*)\s*$", lines[i])
            if not m:
                i += 1
                continue
            indent, lang = m.group(1), m.group(2)
            j = i + 1
            while j < len(lines) and not re.match(rf"^{indent}```\s*$", lines[j]):
                j += 1
            assert j < len(lines), f"{path.name}:{i + 1}: a code block that is never closed"
            body = "\n".join(line[len(indent):] for line in lines[i + 1:j])
            found.append(Block(path.relative_to(ROOT).as_posix(), i + 1, lang, body + "\n"))
            i = j + 1
    return found


# (language, a piece of the block's text) -> how the block is kept true.
BLOCKS: list[tuple[str, str, str]] = [
    ("bash", "pip install torch==2.13.0 && pip install -e . && ddpdoctor check",
     "test:test_readme.py::test_exactly_two_setup_commands_and_ci_runs_the_test_one"),
    ("text", "$ ddpdoctor check\nddpdoctor", "real:check"),
    ("text", "$ ddpdoctor run --hang-timeout 10 -- torchrun --nproc-per-node 2 examples/hang.py", "real:run-and-stacks"),
    ("text", "$ ddpdoctor stacks 24135 ", "real:run-and-stacks"),
    ("text", "$ ddpdoctor explain --log examples/failed-job.log", "real:explain"),
    ("text", "$ ddpdoctor locate          # under srun/torchrun/mpirun, on 4 hosts",
     "test:test_locate.py::test_rate_limited_host_is_named_and_a_clean_world_names_no_one"),
    ("python", "predictions = dd.gather_for_metrics(torch.cat(predictions), sampler)",
     "test:test_library_readme.py::test_readme_example_runs_alone_and_in_a_gloo_world"),
    ("text", "$ torchrun --nproc-per-node 2 examples/evaluate.py",
     "test:test_library_readme.py::test_readme_example_exits_cleanly_every_time"),
    ("text", "ddpdoctor/\n  cli.py", "real:architecture-tree"),
    ("text", "$ ddpdoctor check --master-port 29500",
     "test:test_runner_local.py::test_port_held_by_a_real_socket_is_named_and_the_group_is_skipped"),
    ("text", "[CRASH] process-group  rank 1 raised RuntimeError: CUDA error: invalid device ordinal",
     "test:test_root_cause.py::test_local_world_names_the_failed_rank_first_and_fast"),
    ("text", "[TIME]  collectives    ranks 0-1,3 stuck in all_reduce",
     "test:test_collectives.py::test_rank_that_never_reaches_an_operation_is_named_with_it"),
    ("text", "$ ddpdoctor explain --fr dumps --prefix fr- --world-size 4",
     "test:test_flight_recorder.py::test_spawn_job_explain_names_lines_and_missing_rank"),
    ("", "gather(): ranks disagree: rank 0: float32[2, 3]",
     "test:test_library_agreement.py::test_disagreement_matrix_every_rank_raises_the_same_error_and_the_next_call_is_right"),
    ("console", "$ ddpdoctor check --model mypkg.models:build_model --input-shape 8,3,32,32",
     "test:test_diag_checks.py::test_user_models_and_broken_setups_are_caught_and_named"),
    ("python", "sampler = dd.guard_sampler(DistributedSampler(dataset))",
     "test:test_diag_readme.py::test_readme_example_runs_without_warnings_on_two_ranks"),
    ("text", "error[param-desync]: 1 tensor differs across ranks:",
     "test:test_diag_desync.py::test_assert_in_sync_catches_and_names_every_kind_of_desync_on_three_ranks"),
    ("text", "$ ddpdoctor bench --max-bytes 16M --ops 'all_reduce(sum)' --json bench.json",
     "test:test_collectives_cli.py::test_bench_prints_an_nccl_tests_table_and_writes_json"),
    ("bash", "srun ddpdoctor check --json \"preflight-$SLURM_JOB_ID.json\"", "test:test_slurm.py::*"),
    ("bash", "torchrun --nproc-per-node 2 -m ddpdoctor check\n",
     "test:test_collectives_cli.py::test_bench_joins_a_torchrun_world_and_reports_once"),
    ("bash", "torchrun --nnodes 2 --node-rank \"$NODE_RANK\" --nproc-per-node 8",
     "test:test_multihost.py::test_torchrun_two_nodes_one_report_covering_both"),
    ("yaml", "kind: PyTorchJob", "real:pods"),
    ("text", "ddpdoctor run: rank 2 on node2 is a straggler: score 0.77",
     "test:test_locate.py::test_run_names_the_rank_that_works_slowest_and_a_clean_job_names_no_one"),
    ("text", "ddpdoctor run: [sampler-epoch] ranks 0, 1: the DistributedSampler's shuffled order repeats",
     "test:test_watches.py::test_tutorial_program_without_set_epoch_is_named_and_its_fixed_twin_is_not"),
    ("text", "$ ddpdoctor run --hang-timeout 120 -- torchrun --nproc-per-node 2 train.py",
     "test:test_jobrun.py::test_hang_names_the_rank_and_line_and_exits_124"),
    ("text", "ddpdoctor run: hung: no rank made progress for 3s\n  Flight Recorder:",
     "test:test_run_recorder.py::test_hang_through_ddps_reducer_against_a_barrier_leads_with_the_collective"),
    ("text", "--- rank 1 (pid 81240), read with handler", "test:test_stacks.py::test_stacks_of_a_live_torchrun_job"),
    ("python", "from ddpdoctor.compat.lightning import all_gather", "real:compat-imports"),
    ("text", "ddpdoctor run: no progress for 100 s on any rank; verdict at 300 s",
     "test:test_newcomer.py::test_a_silence_of_a_third_of_the_hang_timeout_is_said_once_with_the_stacks_command"),
    ("text", "$ ddpdoctor run --list\n",
     "test:test_newcomer.py::test_run_list_and_prune_remove_only_old_marked_run_directories_and_follow_no_link"),
]

# The real runs of this file, by name (each is one test below).
REAL = {
    "check": "test_check_block_and_the_preflight_commands_run_here",
    "run-and-stacks": "test_run_and_stacks_blocks_on_the_hanging_example",
    "explain": "test_explain_block_is_what_explain_prints_for_the_example_log",
    "architecture-tree": "test_architecture_tree_names_only_what_exists",
    "pods": "test_kubernetes_pods_run_the_preflight_then_the_job",
    "compat-imports": "test_compat_imports_block_imports_what_it_names",
}


def _entry(block: Block) -> tuple[str, str, str]:
    matches = [e for e in BLOCKS if e[0] == block.lang and e[1] in block.text]
    assert len(matches) == 1, (f"{block.page}:{block.line}: a ```{block.lang} block matched {len(matches)} entries of "
                               f"BLOCKS in tests/test_docs.py; add one (with a test that runs it) or make it unique")
    return matches[0]


def _block(piece: str) -> str:
    """The one text of the blocks holding ``piece`` (the same block on several pages runs once)."""
    texts = {b.text for b in _blocks() if piece in b.text}
    assert len(texts) == 1, f"{len(texts)} different blocks hold {piece!r}: keep their copies identical"
    return texts.pop()


def test_every_block_is_accounted_for():
    blocks = _blocks()
    assert len(blocks) >= 30, len(blocks)
    used = {_entry(b) for b in blocks}
    assert used == set(BLOCKS), f"entries that match no block any more: {set(BLOCKS) - used}"
    for _, _, how in BLOCKS:
        kind, _, what = how.partition(":")
        if kind == "real":
            assert what in REAL and re.search(rf"^def {REAL[what]}\(", Path(__file__).read_text(), re.M), how
            continue
        assert kind == "test", how
        file, _, name = what.partition("::")
        source = (ROOT / "tests" / file).read_text(encoding="utf-8")
        assert name == "*" or re.search(rf"^def {re.escape(name)}\(", source, re.M), f"{how}: no such test"


# --- the commands: every ddpdoctor command of every block and every inline `ddpdoctor ...` span, parsed by
#     the CLI itself, in this process (one import, no world formed) --------------------------------------

PLACEHOLDERS = {"<pid>": "4242", "<your launcher>": "torchrun train.py", "<your launcher and command>": "torchrun train.py",
                "<launcher and command>": "torchrun train.py", "N": "2", "FILE": "job.log", "DIR": "dumps"}


def _ddpdoctor_args(tokens: list[str]) -> list[list[str]]:
    """The argument lists given to ddpdoctor in one shell command: `ddpdoctor ARGS`, `-m ddpdoctor ARGS`,
    behind srun, torchrun or mpirun, up to the next shell operator."""
    found = []
    for i, tok in enumerate(tokens):
        if tok != "ddpdoctor":
            continue
        before = tokens[i - 1] if i else ";"
        if before not in ("-m", "srun", "mpirun", "&&", "||", ";", "|", "(", "{") and not before.isdigit():
            continue  # a word, not the command (`pip install ddpdoctor`)
        args = []
        for t in tokens[i + 1:]:
            if t in ("&&", "||", ";", "|", ")", "}", ";;") or t.startswith((">", "2>")):
                break
            args.append(t)
        found.append(args)
    return found


def _shell_commands(text: str) -> list[list[str]]:
    """The ddpdoctor argument lists of a shell text (continuation lines joined, comments dropped)."""
    text = text.replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|(){}")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError:
            continue  # a line of a multi-line shell construct (a quoted string): its commands are on other lines
        found += _ddpdoctor_args(tokens)
    return found


def _block_commands(block: Block) -> list[list[str]]:
    if block.lang in ("bash", "console", "sh"):
        text = "\n".join(line[2:] if line.startswith("$ ") else line for line in block.text.splitlines())
        return _shell_commands(text)
    if block.lang == "yaml":
        commands = []
        for line in block.text.splitlines():
            m = re.match(r"^\s*command:\s*(\[.*\])\s*$", line)
            if m:
                argv = json.loads(m.group(1))
                commands += _shell_commands(argv[2] if argv[:2] == ["bash", "-c"] else shlex.join(argv))
        return commands
    # text blocks: the command lines, after `$ `
    return _shell_commands("\n".join(line[2:] for line in block.text.splitlines() if line.startswith("$ ")))


def _inline_commands() -> list[tuple[str, list[str]]]:
    """`ddpdoctor SUBCOMMAND ...` and `... -m ddpdoctor ...` spans of the prose (not the usage synopses)."""
    from ddpdoctor.cli import cli

    names = set(cli.commands)
    found = []
    for path in PAGES:
        for span in re.findall(r"`([^`\n]*\bddpdoctor [a-z][^`\n]*)`", path.read_text(encoding="utf-8")):
            if "[" in span:
                continue  # a synopsis: its options are checked by test_every_synopsis_names_real_options
            for before, after in PLACEHOLDERS.items():
                span = re.sub(rf"(?<![\w-]){re.escape(before)}(?![\w-])", after, span)
            span = span.replace("\\|", "|")
            for args in _shell_commands(span):
                if args and args[0] in names:
                    found.append((f"{path.name}: `{span}`", args))
    return found


def _parse(args: list[str]) -> None:
    """Parse ``ddpdoctor ARGS`` as the CLI does, without running the command: click converts every value
    and raises on an unknown option, a bad type or a number out of range."""
    import click

    from ddpdoctor.cli import cli

    with click.Context(cli, info_name="ddpdoctor") as parent:
        command = cli.get_command(parent, args[0])
        assert command is not None, f"no command {args[0]!r}"
        with command.make_context(args[0], list(args[1:]), parent=parent) as ctx:
            # `run` passes what it does not know on as the job's command, which then cannot start
            launched = ctx.params.get("command") or ()
            assert not (launched and launched[0].startswith("-")), f"{launched[0]}: not an option of {args[0]}"


def test_every_ddpdoctor_command_in_the_pages_parses():
    commands = [(f"{b.page}:{b.line}", args) for b in _blocks() for args in _block_commands(b)]
    commands += _inline_commands()
    assert len(commands) >= 40, commands
    failed = []
    for where, args in commands:
        args = ["4242" if a == "24135" else a for a in args]
        try:
            if len(args) == 1 and where.endswith(f"`ddpdoctor {args[0]}`"):
                from ddpdoctor.cli import cli

                assert args[0] in cli.commands, f"no command {args[0]!r}"  # a command named in prose
                continue
            _parse(args)
        except Exception as exc:  # noqa: BLE001 - every failure is reported together below
            failed.append(f"{where}: ddpdoctor {shlex.join(args)}: {type(exc).__name__}: {exc}")
    assert not failed, "\n".join(failed)


def test_every_synopsis_names_real_options():
    from ddpdoctor.cli import cli

    checked = 0
    for path in PAGES:
        for name, rest in re.findall(r"`ddpdoctor ([a-z]+) (\[[^`\n]*)`", path.read_text(encoding="utf-8")):
            command = cli.commands[name]
            known = {opt for p in command.params for opt in getattr(p, "opts", [])}
            for option in re.findall(r"--[a-z][a-z-]*", rest):
                assert option in known, f"{path.name}: `ddpdoctor {name} {rest}` names {option}, which it lacks"
                checked += 1
    assert checked >= 8


def test_every_shell_and_python_block_parses():
    for block in _blocks():
        where = f"{block.page}:{block.line}"
        if block.lang == "bash":
            p = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True, timeout=30)
            assert p.returncode == 0, f"{where}: {p.stderr}"
        elif block.lang == "python":
            compile(block.text, where, "exec")
        elif block.lang == "yaml":
            commands = [line for line in block.text.splitlines() if re.match(r"^\s*command:", line)]
            assert commands and all(_block_commands(block)), where
            for line in commands:
                argv = json.loads(line.split(":", 1)[1])
                p = subprocess.run(["bash", "-n", "-c", argv[2]], capture_output=True, text=True, timeout=30)
                assert p.returncode == 0, f"{where}: {p.stderr}"
            assert re.search(r"^apiVersion: \S+\nkind: \S+\n", block.text, re.M), where
            for line in block.text.splitlines():  # indentation in steps of two spaces, no tab
                assert "\t" not in line and (len(line) - len(line.lstrip(" "))) % 2 == 0, f"{where}: {line!r}"


def test_the_readme_library_example_is_the_file_it_says_it_runs():
    example = _block("predictions = dd.gather_for_metrics(torch.cat(predictions), sampler)")
    assert (ROOT / "examples" / "evaluate.py").read_text(encoding="utf-8") == example


# --- links ------------------------------------------------------------------------------------------------

def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to dashes, repeats -1, -2."""
    seen: dict[str, int] = {}
    anchors = set()
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_every_relative_link_and_anchor_resolves():
    checked, broken = 0, []
    for path in PAGES:
        text = re.sub(r"^ *```.*?^ *```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue  # an absolute URL: not followed (no network)
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            checked += 1
            if not dest.exists():
                broken.append(f"{path.name}: {target}: no file {dest}")
            elif anchor and (dest.suffix != ".md" or anchor not in _anchors(dest)):
                broken.append(f"{path.name}: {target}: no heading with anchor #{anchor} in {dest.name}")
    assert not broken, "\n".join(broken)
    assert checked >= 40, checked


def test_every_page_is_linked_from_the_index_and_the_readme_and_starts_with_a_summary():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "index.md":
            assert f"]({page.name})" in index, page.name
            assert f"](docs/{page.name})" in readme, page.name
            lines = page.read_text(encoding="utf-8").split("\n")
            assert lines[0].startswith("# "), page.name
            summary = next(x for x in lines[1:] if x and not x.startswith("["))  # after the title and the nav line
            assert len(summary) > 40 and not summary.startswith(("#", "-", "|", "```")), (page.name, summary)


def test_the_readme_is_short_and_its_table_comes_first():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").split("\n")
    assert len(lines) <= 250, len(lines)
    table = lines.index("## Your problem, the command")
    assert table < 80
    rows = "\n".join(lines[table:80])
    for command in ("torchrun --nproc-per-node N -m ddpdoctor check", "srun ddpdoctor check",
                    "ddpdoctor run -- <your launcher>", "ddpdoctor stacks <pid>", "ddpdoctor explain --log FILE",
                    "ddpdoctor locate", "import ddpdoctor as dd", "dd.zero_first()", "dd.gather_for_metrics()",
                    "dd.assert_in_sync()"):
        assert f"`{command}`" in rows, command


# --- the real runs ----------------------------------------------------------------------------------------

def _normal(line: str) -> str:
    """A line with what changes from run to run made uniform: a run directory, directories before a .py file,
    numbers, runs of spaces."""
    line = re.sub(r"\S*/ddpdoctor/runs/\S+", "RUNDIR", line)
    line = re.sub(r"[\w./-]*/(?=[\w.-]+\.py\b)", "", line)
    line = re.sub(r"\d+(\.\d+)?", "N", line)
    return " ".join(line.split())


def _shown_in_order(sample: str, real: str) -> None:
    """Each line of the sample (after its `$` line) is printed, in this order; a sample line ending in "..."
    is a line that starts so; a line starting with "..." stands for output left out."""
    lines = [x for x in real.splitlines() if x.strip()]
    at = 0
    for want in sample.splitlines()[1:]:
        if not want.strip() or want.lstrip().startswith("..."):
            continue
        cut = want.endswith("...")
        key = _normal(want[:-3] if cut else want)
        while at < len(lines) and not (_normal(lines[at]).startswith(key) if cut else _normal(lines[at]) == key):
            at += 1
        assert at < len(lines), f"not printed (in this order): {want!r}\n--- printed:\n{real}"
        at += 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(cli_env: dict, tmp_path: Path) -> dict:
    return dict(cli_env, PYTHONWARNINGS=QUIET, XDG_STATE_HOME=str(tmp_path / "state"),
                PATH=os.path.dirname(sys.executable) + os.pathsep + cli_env.get("PATH", ""))


def _command(piece: str) -> list[str]:
    first = _block(piece).splitlines()[0]
    return shlex.split(first[2:], comments=True)


@pytest.mark.timeout(180)
def test_check_block_and_the_preflight_commands_run_here(cli_env, tmp_path):
    """One local world for the README's (and docs/checks.md's) `ddpdoctor check` and for the ddpdoctor part of
    every pre-flight command (Slurm's srun, torchrun's, Kubernetes'), with their options together
    (`--timeout 60`, `--json`): the report has the sample's lines, exit 0, the JSON says so."""
    preflight = {shlex.join(args) for b in _blocks() if b.page == "docs/preflight.md" for args in _block_commands(b)}
    assert preflight == {"check", "check --timeout 60", "check --json 'preflight-$SLURM_JOB_ID.json'"}, preflight
    sample = _block("$ ddpdoctor check\nddpdoctor")
    assert _command("$ ddpdoctor check\nddpdoctor") == ["ddpdoctor", "check"]
    report = tmp_path / "preflight-1.json"
    p = subprocess.run([sys.executable, "-m", "ddpdoctor", "check", "--timeout", "60", "--json", str(report)],
                       env=_env(cli_env, tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(report.read_text())["exit_code"] == 0

    def shape(line: str) -> list[str]:
        return re.sub(r"[\d.]+", "N", line).split()[:3]

    assert [shape(x) for x in sample.splitlines()[1:]] == [shape(x) for x in p.stdout.splitlines()]


@pytest.mark.timeout(120)
def test_explain_block_is_what_explain_prints_for_the_example_log(cli_env, tmp_path):
    """The README's explain block, run as written from the checkout: the same output, line for line; and
    `ddpdoctor locate` (the README's other command) runs here on a local world and names no one."""
    sample = _block("$ ddpdoctor explain --log examples/failed-job.log")
    args = _command("$ ddpdoctor explain --log examples/failed-job.log")
    env = _env(cli_env, tmp_path)
    p = subprocess.run([sys.executable, "-m", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == sample.splitlines()[1:]
    args = _command("$ ddpdoctor locate          # under")
    p = subprocess.run([sys.executable, "-m", *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"^\[ok\]\s+locate\s+no suspect", p.stdout, re.M), p.stdout


def _hang_and_look(run_args: list[str], stacks_args: list[str], env: dict) -> tuple[str, str] | None:
    """Run the hanging job under ddpdoctor run and look at it with ddpdoctor stacks once both ranks are stuck:
    (run's output, the look's output), or None when the verdict came first (the look took longer than the
    hang timeout: a machine under load)."""
    job = subprocess.Popen([sys.executable, "-m", *run_args], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    printed: list[str] = []
    both_stuck = threading.Event()

    def read() -> None:
        for line in job.stdout:
            printed.append(line)
            if sum(f"rank {r}: step 1 done" in x for x in printed for r in (0, 1)) == 2:
                both_stuck.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert both_stuck.wait(120), "".join(printed)
        args = [str(job.pid) if a == "24135" else a for a in stacks_args]
        look = subprocess.run([sys.executable, "-m", *args], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=90)
        assert job.wait(timeout=150) == 124, "".join(printed)
        reader.join(10)
        if look.returncode != 0 and any("ddpdoctor run: hung" in x for x in printed):
            return None  # the verdict stopped the job while the look was reading it
        assert look.returncode == 0, look.stdout + look.stderr
        return "".join(printed), look.stdout
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
        job.stdout.close()


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_run_and_stacks_blocks_on_the_hanging_example(cli_env, tmp_path):
    """The README's `ddpdoctor run` block, run as written from the checkout (torchrun given a free port, never
    its default 29500), and its `ddpdoctor stacks` block run on that job while it hangs: each prints the
    block's lines in order, and run exits 124. When the look could not finish within the block's
    `--hang-timeout` (a loaded machine), once more with a minute: the output is the same but for that number."""
    run_args = _command("$ ddpdoctor run --hang-timeout 10 -- torchrun --nproc-per-node 2 examples/hang.py")
    stacks_args = _command("$ ddpdoctor stacks 24135 ")
    at = run_args.index("torchrun") + 1
    run_args[at:at] = ["--master-port", str(_free_port())]
    env = _env(cli_env, tmp_path)
    seen = _hang_and_look(run_args, stacks_args, env)
    if seen is None:
        run_args[run_args.index("--hang-timeout") + 1] = "60"
        run_args[at + 1] = str(_free_port())
        seen = _hang_and_look(run_args, stacks_args, env)
    assert seen is not None, "the stacks look took longer than a minute"
    printed, look = seen
    _shown_in_order(_block("$ ddpdoctor stacks 24135 "), look)
    _shown_in_order(_block("$ ddpdoctor run --hang-timeout 10"), printed)


@pytest.mark.timeout(180)
def test_kubernetes_pods_run_the_preflight_then_the_job(cli_env, tmp_path):
    """The PyTorchJob's pod command, as written, in two processes given what the training operator gives each
    pod (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and the manifest's own env: the pods join one world,
    rank 0 prints the report with no warning, both exit 0 and only then start the job (`python train.py`,
    here a script that says so)."""
    manifest = _block("kind: PyTorchJob")
    commands = {tuple(json.loads(m)) for m in re.findall(r"^\s*command: (\[.*\])$", manifest, re.M)}
    assert len(commands) == 1, commands  # master and workers run the same command
    shell, flag, script = commands.pop()
    assert (shell, flag) == ("bash", "-c") and script.endswith(" && python train.py"), script
    given = dict(re.findall(r'- name: (\w+)\n\s+value: "([^"]*)"', manifest))
    assert given == {"LOCAL_RANK": "0"}, given
    (tmp_path / "train.py").write_text("import os\nprint('training on rank', os.environ['RANK'])\n")
    port = _free_port()
    env = _env(cli_env, tmp_path)
    pods = [subprocess.Popen([shell, flag, script], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=dict(env, **given, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                                 MASTER_PORT=str(port)))
            for r in range(2)]
    try:
        outs = [pod.communicate(timeout=150) for pod in pods]
    finally:
        for pod in pods:
            if pod.poll() is None:
                pod.kill()
                pod.communicate()
    assert [pod.returncode for pod in pods] == [0, 0], outs
    report, rest = outs[0][0].split("\ntraining on rank 0\n")
    assert re.search(r"^\d+ passed in [\d.]+s; exit 0$", report, re.M) and "[warn]" not in report, report
    assert outs[1][0] == "training on rank 1\n", outs[1]


def test_architecture_tree_names_only_what_exists():
    tree = _block("ddpdoctor/\n  cli.py")
    top, named = None, 0
    for line in tree.splitlines()[1:]:
        m = re.match(r"^(  )?([\w]+(?:\.py|/))\s", line + " ")
        if not m:
            continue
        name = m.group(2)
        path = ROOT / name if not m.group(1) else ROOT / (top or "ddpdoctor/") / name
        if not m.group(1):
            top = name
        assert path.exists(), f"the architecture tree names {name}, which is not at {path}"
        named += 1
    assert named >= 12, named


def test_compat_imports_block_imports_what_it_names():
    """The library page's ``ddpdoctor.compat`` block runs as written (every name it imports exists)."""
    namespace: dict = {}
    exec(compile(_block("from ddpdoctor.compat.lightning import all_gather"), "docs/library.md", "exec"), namespace)
    assert callable(namespace["gather_all_tensors"]) and callable(namespace["collect_results"])
