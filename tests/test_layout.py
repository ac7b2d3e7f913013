"""The tree's layout: no folder that tools read as build output, the old ``ddpdoctor.dist`` name as an alias."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GENERATED_NAMES = {"dist", "build", "out", "tmp"}


def test_no_source_folder_has_a_build_output_name():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    folders = {part for line in tracked.splitlines() for part in Path(line).parts[:-1]}
    assert not folders & GENERATED_NAMES, sorted(folders & GENERATED_NAMES)


def test_no_scratch_log_at_the_root():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert not [line for line in tracked.splitlines() if "/" not in line and line.endswith(".log")]


def test_old_dist_name_is_a_deprecated_alias_of_the_same_modules():
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import ddpdoctor.dist as d\n"
        "    from ddpdoctor.dist.gathering import gather\n"
        "    import ddpdoctor.dist.ordering as o\n"
        "import ddpdoctor.training as t, ddpdoctor.training.gathering as tg, ddpdoctor.training.ordering as to\n"
        "assert any(issubclass(x.category, DeprecationWarning) and 'ddpdoctor.training' in str(x.message) for x in w)\n"
        "assert gather is tg.gather and o is to and d.zero_first is t.zero_first\n"
        "assert to.__spec__.name == 'ddpdoctor.training.ordering'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
