"""Extract the message templates the distributed-training stack prints, from pinned versions of its source.

Writes ``templates.tsv`` beside this file: one row per message (emitter, file, version, template), the
template being the message text with each formatted value replaced by ``{}``. ``tests/test_emitters.py``
computes from that list which templates the cause catalogue covers (coverage per emitter).

What is mined (issue 25), and how:

- torch (Python): ``raise X("...")``, ``warnings.warn("...")`` and ``logger.warning/error("...")`` in the
  distributed paths of an installed torch (``--torch DIR``: the package directory; the version is read from
  ``version.py``): DDP, ``torch.distributed`` (c10d, elastic, run/launch, FSDP, rendezvous, checkpoint),
  ``torch.multiprocessing`` and the DataLoader's worker errors. Parsed with :mod:`ast` (f-strings and
  ``%``/``.format`` templates become ``{}``).
- NCCL (C): ``WARN("...")`` and the error strings of ``ncclGetErrorString`` in ``src/`` of a git checkout
  at a tag (``--nccl GITDIR@TAG``).
- gloo (C++): ``GLOO_ENFORCE*``/``GLOO_THROW*``/``GLOO_ERROR_MSG`` messages (``--gloo GITDIR@REV``).
- accelerate (Python): as torch, in ``src/accelerate`` at a tag (``--accelerate GITDIR@TAG``), the launch,
  state, accelerator and distributed-utility modules.
- torch's C++ (c10d, emitter ``torch-cpp``; ``--torch-cpp DIR [--wheel TORCHDIR]``): the messages of
  ``TORCH_CHECK``/``TORCH_CHECK_WITH``/``C10_THROW_ERROR``/``C10D_THROW_ERROR``/``C10D_CHECK_WITH``/DDP's
  ``REDUCER_CHECK`` (raised), ``TORCH_WARN``/``TORCH_WARN_ONCE``, ``LOG(ERROR|WARNING|FATAL) << ...`` chains,
  ``C10D_ERROR``/``C10D_WARNING`` (fmt-style, ``{}`` kept) and socket.cpp's ``recordError``, the stringstream
  ``ss << ...`` messages and the message variables handed to them (``std::string errMsg = c10::str(...)``,
  ``kBaseErrorMsg += "..."``). Adjacent literals are joined; ``c10::str``/``fmt::format``/``+`` are read inside,
  any other value is ``{}``. Not mined (the rule): ``TORCH_INTERNAL_ASSERT*`` (torch's own invariants; the log
  then says "please report a bug to PyTorch"), informational ``LOG(INFO)``/``VLOG``/``C10D_INFO``/``C10D_DEBUG``/
  ``C10D_TRACE`` lines, and too little text to tell apart. The file column names the kind when it is not an
  exception (``reducer.cpp (TORCH_WARN)``, ``(LOG ERROR)``, ``(C10D_WARNING)``): ``coverage.py`` shows each as c10d
  prints it. The version is per file: the wheel's c10d headers (``--wheel``: ``Utils.hpp``, ``NCCLUtils.hpp``,
  ``Backend.hpp``, ``ProcessGroup.hpp``, ``ProcessGroupNCCL.hpp``, ``ProcessGroupGloo.hpp``, ``Store.hpp``) at
  the wheel's own version (``2.13.0 (cf30153)``); each file in DIR at the ``@version`` line it carries.

  How DIR was made (issue 25): the wheel holds no ``.cpp`` and the pytorch snapshot (4 GB) is over what the
  search tool's ``fetch`` brings, so each file was read with its ``read_file`` (pages of 16,000 characters) from
  the stored pytorch/pytorch, which holds none of them at the 2.13.0 commit cf30153 (asked for reducer,
  ProcessGroupNCCL, ProcessGroupGloo, TCPStore, socket) and gives other versions without their place in
  history; each file is the version it gave, named ``main@<commit>``: reducer.cpp ad78a7b33a49,
  ProcessGroupNCCL.cpp 0007e752d518, NCCLUtils.cpp 37ee6bc70d61, ProcessGroupGloo.cpp c194358a8ee4,
  TCPStore.cpp 00321a02d719, TCPStoreBackend.cpp f3e8ca07ae54, socket.cpp 8cf1b8e39425, FileStore.cpp
  d0eaa6b7ceeb, ProcessGroupWrapper.cpp 2be21493acad, comm.cpp b5e035bdc57e, ProcessGroup.cpp 3d1297323130,
  Work.cpp beb877344aa0, logger.cpp 0c8d53403bb7 (Backend.cpp has no message; TCPStoreLibUvBackend.cpp was not
  read). Kept out of the repository (/work/scratch/cppsrc/ while developing): for each file, the statements
  that raise, warn or log, copied verbatim in file order, under a header naming the commit and an ``@version``
  line. A full copy of a file works the same. Cross-check: of the 227 templates from files compiled into the
  CPU wheel, 205 are found verbatim in 2.13.0's libtorch_cpu.so/libtorch_python.so (``strings``); the rest
  are mostly messages assembled from several literals, which that check cannot join.

Run (the sources are fetched while developing, never committed; an emitter not given keeps its rows):
    python tests/data/emitters/extract.py --torch .../site-packages/torch \\
        --nccl /work/.mirror/NVIDIA+nccl/repo@v2.30.7-1 --gloo /work/.mirror/pytorch+gloo/repo@70dc360 \\
        --accelerate /work/.mirror/huggingface+accelerate/repo@v1.14.0
    python tests/data/emitters/extract.py --torch-cpp /work/scratch/cppsrc --wheel .../site-packages/torch
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "templates.tsv")

TORCH_PATHS = ("nn/parallel/distributed.py", "distributed/", "multiprocessing/spawn.py",
               "utils/data/dataloader.py", "utils/data/_utils/signal_handling.py", "utils/data/_utils/worker.py")
TORCH_SKIP = ("distributed/_", "distributed/tensor/", "distributed/pipelining/", "distributed/rpc/",
              "distributed/autograd/", "distributed/nn/api/", "distributed/benchmarks/", "distributed/examples/",
              "distributed/optim/", "distributed/algorithms/_", "/test", "distributed/flight_recorder/")
ACCELERATE_PATHS = ("src/accelerate/accelerator.py", "src/accelerate/state.py", "src/accelerate/commands/launch.py",
                    "src/accelerate/utils/launch.py", "src/accelerate/utils/environment.py",
                    "src/accelerate/utils/operations.py", "src/accelerate/utils/fsdp_utils.py",
                    "src/accelerate/utils/dataclasses.py", "src/accelerate/data_loader.py")
LOG_CALLS = {"warn", "warning", "error", "critical", "exception", "fatal"}
PLACEHOLDER = "{}"
_PRINTF = re.compile(r"%[-+ #0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|z|j|t|L)?[diouxXeEfgGcspn]|%\"PRI\w+\"?|%%")
_C_STRING = r'"(?:[^"\\\n]|\\.)*"'


# ---------------------------------------------------------------------------------------------- Python
def _py_template(node) -> str | None:
    """The text of a message expression with formatted values as ``{}``; None when it has no text."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else PLACEHOLDER for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _py_template(node.left), _py_template(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else PLACEHOLDER) + (right if right is not None else PLACEHOLDER)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        left = _py_template(node.left)
        return None if left is None else _PRINTF.sub(lambda m: "%" if m.group() == "%%" else PLACEHOLDER, left)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        base = _py_template(node.func.value)
        return None if base is None else re.sub(r"\{[^{}]*\}", PLACEHOLDER, base)
    return None


def _py_messages(source: str) -> list:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        call = None
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            call = node.exc
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LOG_CALLS:
            call = node
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_log_and_throw":
            call = node  # DDP's self._log_and_throw(ErrorType, "message")
        if call is None or not call.args:
            continue
        text = _py_template(call.args[-1] if getattr(call.func, "attr", None) == "_log_and_throw" else call.args[0])
        if text is not None and call is node and len(call.args) > 1:
            text = _PRINTF.sub(lambda m: "%" if m.group() == "%%" else PLACEHOLDER, text)  # logger("%s", x)
        if text is not None:
            out.append(text)
    return out


# ---------------------------------------------------------------------------------------------- C/C++
def _c_unescape(lit: str) -> str:
    body = lit[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": " ", "t": " "}.get(m.group(1), m.group(1)), body)


def _balanced(text: str, start: int) -> str:
    """The argument text of the call whose ``(`` is at ``start`` (strings and nesting honoured)."""
    depth, i, n = 0, start, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            m = re.compile(_C_STRING).match(text, i)
            i = m.end() if m else i + 1
            continue
        if ch == "'":
            i = text.find("'", i + 2 if text[i + 1] == "\\" else i + 1) + 1 or n
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return text[start + 1:i]
        i += 1
    return text[start + 1:]


def _split_args(args: str) -> list:
    """A call's arguments: ``args`` split on its top-level commas."""
    return _top_split(args, ",")


def _c_template(args: list, printf: bool) -> str | None:
    """Template from a call's arguments: adjacent literals joined; other arguments are ``{}`` (c10::str style),
    or, for printf-style calls, the first argument's format with its conversions as ``{}``."""
    pieces = []
    for arg in args:
        lits = re.findall(_C_STRING, arg)
        if lits and re.fullmatch(r"(?:\s*" + _C_STRING + r"\s*|\s*[A-Z_]+\s*)+", arg):
            pieces.append("".join(_c_unescape(x) for x in lits))
        elif not printf:
            pieces.append(PLACEHOLDER)
        if printf and pieces:
            break
    if not any(p != PLACEHOLDER for p in pieces):
        return None
    text = "".join(pieces)
    if printf:
        text = _PRINTF.sub(lambda m: "%" if m.group() == "%%" else PLACEHOLDER, text)
    return text


def _c_messages(source: str, macros: dict) -> list:
    out = []
    for m in re.finditer(r"\b(" + "|".join(macros) + r")\s*\(", source):
        args = _split_args(_balanced(source, m.end() - 1))
        skip, printf = macros[m.group(1)]
        text = _c_template(args[skip:], printf)
        if text:
            out.append(text)
    return out


NCCL_MACROS = {"WARN": (0, True)}
GLOO_MACROS = {"GLOO_ENFORCE": (1, False), "GLOO_ENFORCE_EQ": (2, False), "GLOO_ENFORCE_NE": (2, False),
               "GLOO_ENFORCE_LT": (2, False), "GLOO_ENFORCE_LE": (2, False), "GLOO_ENFORCE_GT": (2, False),
               "GLOO_ENFORCE_GE": (2, False), "GLOO_THROW": (0, False), "GLOO_THROW_IO_EXCEPTION": (0, False),
               "GLOO_THROW_INVALID_OPERATION_EXCEPTION": (0, False), "GLOO_ERROR_MSG": (0, False)}


def _nccl_error_strings(source: str) -> list:
    """The texts of ``ncclGetErrorString`` (``case ncclX: return "..."``)."""
    body = source[source.find("ncclGetErrorString"):]
    return [_c_unescape(lit) for lit in re.findall(r"case nccl\w+\s*:\s*return\s*(" + _C_STRING + ")", body[:6000])]


# ---------------------------------------------------------------------------------------------- torch C++
# How torch's C++ (c10d) raises, warns and logs: macro -> (arguments before the message, how the message is
# formed, the kind the log shows). "str": c10::str-style (literals joined, any other argument is one value);
# "fmt": fmt-style (the first argument is the format, its ``{}`` kept). Kinds: "raise" (an exception: its
# message, then "Exception raised from FUNC at .../FILE:LINE"), "warn" (TORCH_WARN: "[W FILE:LINE] Warning:
# MSG (function FUNC)"), "log-E"/"log-W" (glog-style "[E FILE:LINE] MSG"), "c10d-E"/"c10d-W" (the same with
# the "[c10d] " prefix C10D_ERROR/C10D_WARNING add).
# Not mined (the rule): TORCH_INTERNAL_ASSERT* (torch's own invariants: when one fires the log says
# "INTERNAL ASSERT FAILED ... please report a bug to PyTorch", a torch bug, not a cause a user can act on),
# LOG(INFO)/VLOG/C10D_INFO/C10D_DEBUG/C10D_TRACE (informational lines, shown only with
# TORCH_CPP_LOG_LEVEL=INFO and never the failure), and anything with too little text to tell apart.
CPP_MACROS = {
    "TORCH_CHECK": (1, "str", "raise"), "TORCH_CHECK_WITH": (2, "str", "raise"),
    "C10_THROW_ERROR": (1, "str", "raise"), "C10D_THROW_ERROR": (1, "str", "raise"),
    "C10D_CHECK_WITH": (2, "str", "raise"), "REDUCER_CHECK": (2, "str", "raise"),
    "TORCH_WARN": (0, "str", "warn"), "TORCH_WARN_ONCE": (0, "str", "warn"),
    "C10D_ERROR": (0, "fmt", "c10d-E"), "C10D_WARNING": (0, "fmt", "c10d-W"),
    "recordError": (0, "fmt", "c10d-W"),  # socket.cpp: logged with C10D_WARNING, then joined into the raise
    "invalidArgument": (0, "str", "raise"),  # ProcessGroup{Gloo,NCCL}: raised as "ProcessGroupX::op: " + msg
}
_CPP_LOG = re.compile(r"\b(?:LOG|C10_LOG_EVERY_N|LOG_EVERY_N|C10_LOG_FIRST_N)\s*\(\s*(ERROR|WARNING|FATAL)\b[^;)]*\)\s*<<")
_CPP_STREAM = re.compile(r"\b(?:ss|oss)\s*<<")
_CPP_VAR = re.compile(r"(?:\b(?:std::string|auto|constexpr\s+auto\s*\*)\s+)?\b((?:k?[A-Za-z]*(?:[Mm]sg|[Ee]rr(?:or)?|[Ii]nfo|"
                      r"[Rr]eason|interpret|[Mm]essage|Error)[A-Za-z_]*))\s*(\+?=)(?!=)\s*")
_CPP_KIND = {"raise": "", "warn": " (TORCH_WARN)", "log-E": " (LOG ERROR)", "log-W": " (LOG WARNING)",
             "log-F": " (LOG ERROR)", "c10d-E": " (C10D_ERROR)", "c10d-W": " (C10D_WARNING)"}
CPP_HEADERS = ("Utils.hpp", "NCCLUtils.hpp", "Backend.hpp", "ProcessGroup.hpp", "ProcessGroupNCCL.hpp",
               "ProcessGroupGloo.hpp", "Store.hpp", "exception.h")


def _statement(text: str, start: int) -> str:
    """The text from ``start`` to the end of its statement (the first ``;`` outside strings and brackets)."""
    depth, i, n = 0, start, len(text)
    lit = re.compile(_C_STRING)
    while i < n:
        ch = text[i]
        if ch == '"':
            m = lit.match(text, i)
            i = m.end() if m else i + 1
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                return text[start:i]
        elif ch == ";" and depth == 0:
            return text[start:i]
        i += 1
    return text[start:]


def _top_split(expr: str, sep: str) -> list:
    """``expr`` split on ``sep`` outside strings and brackets."""
    parts, depth, cur, i = [], 0, [], 0
    lit = re.compile(_C_STRING)
    while i < len(expr):
        ch = expr[i]
        if ch == '"':
            m = lit.match(expr, i)
            if m:
                cur.append(m.group())
                i = m.end()
                continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if depth == 0 and expr.startswith(sep, i) and not (sep == "<" and expr.startswith("<<", i)):
            parts.append("".join(cur))
            cur = []
            i += len(sep)
            continue
        cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _cpp_expr(expr: str) -> str:
    """One C++ expression as message text: literals (adjacent ones joined), ``c10::str(...)`` and
    ``fmt::format(...)`` read inside, ``a + b`` concatenation read part by part; any other value is ``{}``."""
    expr = expr.strip()
    if not expr:
        return ""
    if re.fullmatch(r"(?:\s*" + _C_STRING + r"\s*)+", expr):
        return "".join(_c_unescape(x) for x in re.findall(_C_STRING, expr))
    call = re.match(r"(c10::str|fmt::format|std::string|c10::Join)\s*\(", expr)
    if call and len(_balanced(expr, call.end() - 1)) + call.end() + 1 == len(expr):
        args = _split_args(_balanced(expr, call.end() - 1))
        if call.group(1) == "c10::Join":
            return PLACEHOLDER
        return _cpp_message(args, "fmt" if call.group(1) == "fmt::format" else "str")
    if _top_split(expr, "?")[1:]:
        return PLACEHOLDER  # a ternary: one value or another
    parts = _top_split(expr, "+")
    if len(parts) > 1:
        return "".join(_cpp_expr(p) for p in parts)
    return PLACEHOLDER


def _cpp_message(args: list, how: str) -> str:
    if how == "fmt":  # the format string; its {} are the values
        return _cpp_expr(args[0]) if args else ""
    return "".join(_cpp_expr(a) for a in args)


def _cpp_messages(source: str) -> list:
    """(kind, template) of every message in a C++ source: the macros of :data:`CPP_MACROS`, ``LOG(ERROR|WARNING)
    << ...`` and stringstream ``ss << ...`` chains, and the message variables (``std::string errMsg = ...``,
    ``msg += ...``) the macros are given."""
    source = re.sub(r"\\\n", " ", source)  # a macro's line continuations
    out = []
    for m in re.finditer(r"\b(" + "|".join(CPP_MACROS) + r")\s*\(", source):
        skip, how, kind = CPP_MACROS[m.group(1)]
        args = _split_args(_balanced(source, m.end() - 1))
        # (TORCH_WARN_ONCE(flag, "msg") prints the flag first, "0TORCH_NCCL_...": it stays a {})
        out.append((kind, _cpp_message(args[skip:], how)))
    for m in _CPP_LOG.finditer(source):
        kind = {"ERROR": "log-E", "WARNING": "log-W", "FATAL": "log-F"}[m.group(1)]
        out.append((kind, "".join(_cpp_expr(p) for p in _top_split(_statement(source, m.end()), "<<"))))
    for m in _CPP_STREAM.finditer(source):
        out.append(("raise", "".join(_cpp_expr(p) for p in _top_split(_statement(source, m.end()), "<<"))))
    for m in _CPP_VAR.finditer(source):
        rhs = _statement(source, m.end())
        if re.search(_C_STRING, rhs):
            out.append(("raise", _cpp_expr(rhs)))
    return [(k, t) for k, t in out if t and t.replace(PLACEHOLDER, "").strip()]


def mine_torch_cpp(srcdir: str, torch_root: str = "") -> list:
    """Rows for torch's C++ (c10d): each ``*.cpp``/``*.hpp``/``*.h`` in ``srcdir`` (a file's version is the
    ``@version`` line in it, e.g. ``main@ad78a7b33a49``), and the c10d headers the installed wheel ships
    (``torch_root``: its version, ``2.13.0 (cf30153)``)."""
    files = []
    for name in sorted(os.listdir(srcdir)):
        if name.endswith((".cpp", ".hpp", ".h")):
            with open(os.path.join(srcdir, name), encoding="utf-8") as f:
                text = f.read()
            ver = re.search(r"@version\s+(\S+)", text)
            if not ver:
                raise SystemExit(f"{os.path.join(srcdir, name)}: no '@version <tag or main@commit>' line; add one "
                                 "(the version the text was read at)")
            files.append((name, ver.group(1), text))
    if torch_root:
        ns: dict = {}
        with open(os.path.join(torch_root, "version.py"), encoding="utf-8") as f:
            exec(compile(f.read(), "version.py", "exec"), ns)  # noqa: S102 - the package's own version file
        version = f"{ns['__version__'].split('+')[0]} ({ns['git_version'][:7]})"
        inc = os.path.join(torch_root, "include", "torch", "csrc", "distributed", "c10d")
        for name in CPP_HEADERS:
            if os.path.exists(os.path.join(inc, name)) and not any(f[0] == name for f in files):
                with open(os.path.join(inc, name), encoding="utf-8") as f:
                    files.append((name, version, f.read()))
    rows = []
    for name, version, text in files:
        path = "torch/csrc/distributed/c10d/" + name
        rows += [("torch-cpp", path + _CPP_KIND[kind], version, t) for kind, t in _cpp_messages(text)]
    return rows


# ---------------------------------------------------------------------------------------------- sources
def _git(gitdir: str, *args) -> str:
    return subprocess.run(["git", "--git-dir", gitdir, *args], check=True, capture_output=True, text=True,
                          errors="replace").stdout


def _git_files(spec: str) -> tuple:
    gitdir, _, rev = spec.partition("@")
    if not rev:
        raise SystemExit(f"{spec}: give GITDIR@REV (a tag or commit), e.g. /path/repo@v2.30.7-1")
    commit = _git(gitdir, "rev-parse", rev + "^{commit}").strip()
    return gitdir, rev, commit, _git(gitdir, "ls-tree", "-r", "--name-only", commit).split("\n")


def mine_torch(root: str) -> list:
    ns: dict = {}
    with open(os.path.join(root, "version.py"), encoding="utf-8") as f:
        exec(compile(f.read(), "version.py", "exec"), ns)  # noqa: S102 - the package's own version file
    version = ns["__version__"]
    rows = []
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            if not name.endswith(".py") or not rel.startswith(TORCH_PATHS) or any(s in rel for s in TORCH_SKIP):
                continue
            with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                rows += [("torch", "torch/" + rel, version, t) for t in _py_messages(f.read())]
    return rows


def mine_git(emitter: str, spec: str) -> list:
    gitdir, rev, commit, files = _git_files(spec)
    version = rev if not re.fullmatch(r"[0-9a-f]{7,40}", rev) else commit[:12]
    rows = []
    for path in files:
        if emitter == "nccl" and path.startswith("src/") and path.endswith((".cc", ".h", ".cu", ".c")):
            text = _git(gitdir, "show", f"{commit}:{path}")
            found = _c_messages(text, NCCL_MACROS)
            if "ncclGetErrorString" in text and "case ncclSuccess" in text:  # printed bare, not as a WARN
                rows += [(emitter, f"{path} (ncclGetErrorString)", version, t) for t in _nccl_error_strings(text)]
        elif emitter == "gloo" and path.startswith("gloo/") and path.endswith((".cc", ".h")) and "/test" not in path \
                and "/benchmark" not in path:
            found = _c_messages(_git(gitdir, "show", f"{commit}:{path}"), GLOO_MACROS)
        elif emitter == "accelerate" and path in ACCELERATE_PATHS:
            found = _py_messages(_git(gitdir, "show", f"{commit}:{path}"))
        else:
            continue
        rows += [(emitter, path, version, t) for t in found]
    return rows


def _clean(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text


def _kept(out: str, regenerated: set) -> list:
    """The rows already in ``out`` of the emitters not being regenerated (one emitter can be mined again
    without the others' sources at hand); they are kept as they are, in their order."""
    if not os.path.exists(out):
        return []
    with open(out, encoding="utf-8") as f:
        lines = f.read().splitlines()[1:]
    return [tuple(line.split("\t")) for line in lines if line and line.split("\t")[0] not in regenerated]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch", help="an installed torch package directory")
    ap.add_argument("--torch-cpp", help="a folder of torch's c10d C++ sources (each with an '@version' line)")
    ap.add_argument("--wheel", help="with --torch-cpp: an installed torch package whose c10d headers are mined "
                                    "too (the wheel's own version)")
    ap.add_argument("--nccl", help="GITDIR@TAG of NVIDIA/nccl")
    ap.add_argument("--gloo", help="GITDIR@REV of pytorch/gloo")
    ap.add_argument("--accelerate", help="GITDIR@TAG of huggingface/accelerate")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    if not any((args.torch, args.torch_cpp, args.nccl, args.gloo, args.accelerate)):
        ap.error("give at least one source: --torch, --torch-cpp, --nccl, --gloo or --accelerate")
    if args.wheel and not os.path.exists(os.path.join(args.wheel, "version.py")):
        ap.error(f"--wheel {args.wheel}: no version.py there; give the installed torch package's folder "
                 "(python -c 'import torch, os; print(os.path.dirname(torch.__file__))')")
    if args.torch_cpp and not os.path.isdir(args.torch_cpp):
        ap.error(f"--torch-cpp {args.torch_cpp}: not a folder; give the folder the C++ sources were saved in")
    rows, regenerated = [], set()
    if args.torch:
        rows += mine_torch(args.torch)
        regenerated.add("torch")
    if args.torch_cpp:
        rows += mine_torch_cpp(args.torch_cpp, args.wheel or "")
        regenerated.add("torch-cpp")
    for emitter in ("nccl", "gloo", "accelerate"):
        if getattr(args, emitter):
            rows += mine_git(emitter, getattr(args, emitter))
            regenerated.add(emitter)
    seen, kept = set(), []
    for emitter, path, version, text in rows:
        text = _clean(text)
        if len(text.replace(PLACEHOLDER, "").strip(" .:,")) < 8 or (emitter, text) in seen:
            continue  # too little text to tell anything apart, or already listed
        seen.add((emitter, text))
        kept.append((emitter, path, version, text.replace("\t", " ")))
    kept = _kept(args.out, regenerated) + kept
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("emitter\tfile\tversion\ttemplate\n")
        f.writelines("\t".join(r) + "\n" for r in kept)
    emitters = list(dict.fromkeys(r[0] for r in kept))
    counts = {e: sum(1 for r in kept if r[0] == e) for e in emitters}
    print(f"wrote {os.path.relpath(args.out)}: {len(kept)} templates " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
