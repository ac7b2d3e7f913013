"""The architecture as docs/architecture.md states it, checked on the code.

- the layers contract in ``pyproject.toml`` ([tool.importlinter]), run with import-linter;
- no import circle between ddpdoctor's modules (function-level imports included);
- no ``_private`` name imported from another module;
- at most a dozen modules left at the top of ``ddpdoctor/``;
- the top-level package re-exports exactly the library's public names.

``checks/`` installs as ``ddpdoctor.checks`` through a package-dir mapping, which import-linter cannot
follow (it walks one directory per root package), so the contract runs on a copy of the tree where
``checks/`` sits inside ``ddpdoctor/``: the module names are the installed ones.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ddpdoctor"
CHECKS = ROOT / "checks"

pytestmark = pytest.mark.timeout(120)


def _assembled(tmp_path: Path) -> Path:
    """A copy of the installed package layout: ddpdoctor/ with checks/ at ddpdoctor/checks/."""
    dest = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(PACKAGE, dest / "ddpdoctor", ignore=ignore)
    shutil.copytree(CHECKS, dest / "ddpdoctor" / "checks", ignore=ignore)
    return dest


def _modules(src: Path) -> dict:
    """Dotted module name -> parsed AST, for every module of the assembled package."""
    out = {}
    for path in sorted((src / "ddpdoctor").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out[".".join(parts)] = (ast.parse(path.read_text(), str(path)), is_package)
    return out


def _imports(name: str, tree: ast.AST, is_package: bool, known: set) -> list:
    """(imported module, imported names, line) for every first-party import in a module, anywhere in it."""
    found = []
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, (), node.lineno) for a in node.names if a.name.split(".")[0] == "ddpdoctor"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "ddpdoctor":
                continue
            names = tuple(a.name for a in node.names)
            # `from pkg import submodule` imports the submodule
            subs = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in known]
            found += [(s, (), node.lineno) for s in subs]
            found.append((mod, tuple(n for n in names if f"{mod}.{n}" not in known), node.lineno))
    return found


def test_layers_contract(tmp_path: Path) -> None:
    """import-linter's layers contract from pyproject.toml holds (a violation names the import chain)."""
    src = _assembled(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())",
         "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken" in proc.stdout


def test_no_import_circles(tmp_path: Path) -> None:
    """No two modules import each other, directly or through others (function-level imports count)."""
    mods = _modules(_assembled(tmp_path))
    known = set(mods)
    graph = {}
    for name, (tree, is_package) in mods.items():
        graph[name] = {m for m, _, _ in _imports(name, tree, is_package, known)
                       if m in known and m != name and not (is_package and m.startswith(name + "."))}
    # a package's __init__ that re-exports its own modules is not a circle; anything else is
    cycles = _strongly_connected(graph)
    assert not cycles, f"import circles: {cycles}"


def _strongly_connected(graph: dict) -> list:
    """Tarjan's algorithm: the components of more than one module."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_private_names_cross_modules(tmp_path: Path) -> None:
    """``from ddpdoctor.x import _name`` (or a ``_module``) across modules is a hidden dependency."""
    mods = _modules(_assembled(tmp_path))
    known = set(mods)
    bad = []
    for name, (tree, is_package) in mods.items():
        for mod, names, line in _imports(name, tree, is_package, known):
            if mod == name:
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            private += [p for p in mod.split(".") if p.startswith("_") and not p.startswith("__")]
            if private:
                bad.append(f"{name}:{line} imports {', '.join(private)} from {mod}")
    assert not bad, "\n".join(bad)


def test_top_level_stays_small() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top


def test_top_level_reexports_the_library() -> None:
    """``import ddpdoctor`` offers exactly the public names of ddpdoctor.training and ddpdoctor.diagnostics."""
    import ddpdoctor
    import ddpdoctor.diagnostics
    import ddpdoctor.training

    assert set(ddpdoctor.__all__) == {"__version__"} | set(ddpdoctor.training.__all__) | set(ddpdoctor.diagnostics.__all__)
    for name in ddpdoctor.training.__all__:
        assert getattr(ddpdoctor, name) is getattr(ddpdoctor.training, name)
    for name in ddpdoctor.diagnostics.__all__:
        assert getattr(ddpdoctor, name) is getattr(ddpdoctor.diagnostics, name)
