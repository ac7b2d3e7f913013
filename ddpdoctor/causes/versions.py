"""Versions as facts: what is known about the NCCL, CUDA and library versions a log prints.

A small table, each fact with where it comes from, read against the versions in a log (``NCCL version
2.14.3+cuda11.7``, ``torch==2.1.0``, ``PyTorch version: 1.13.1``). ``explain`` adds what applies to the
causes it names; nothing here guesses a cause on its own.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

__all__ = ["NCCL_BF16", "NCCL_KNOWN_BUGS", "NCCL_OUTDATED", "outdated_nccl", "TORCH_BUNDLED_NCCL", "CUDA_FOR_ARCH", "versions_in", "version_facts",
           "known_nccl_bug"]

NCCL_BF16 = (2, 10, 3)
"""The first NCCL with bfloat16 (NVIDIA/nccl#476: 'NCCL 2.10.3 is now released with bfloat16 support')."""

TORCH_BUNDLED_NCCL = {"1.13": "2.14.3", "2.0": "2.14.3", "2.1": "2.18.1", "2.2": "2.19.3", "2.3": "2.20.5",
                      "2.4": "2.20.5", "2.5": "2.21.5"}
"""The NCCL the Linux CUDA wheels of a torch release depend on (nvidia-nccl-cu1x on PyPI)."""

CUDA_FOR_ARCH = {"sm_80": "11.0", "sm_86": "11.1", "sm_89": "11.8", "sm_90": "11.8", "sm_100": "12.8",
                 "sm_120": "12.8"}
"""The first CUDA toolkit that compiles for each GPU architecture (a torch wheel needs that CUDA or newer)."""

# explain6: NCCL releases with a known bug, each with its source (an NVIDIA/nccl thread where a maintainer or the
# reporter settled it): (first affected, end, the families it shows up as, the fact, the source). Only releases the
# source names are claimed: ``first`` is the earliest it names as failing (not a guess at when the bug began) and
# ``end`` the release that fixed it where the source names one, else the next release after the one it names.
NCCL_KNOWN_BUGS = (
    ((2, 19, 3), (2, 19, 4), ("nccl-bootstrap-truncated",),
     "NCCL 2.19.3 fails intermittently at communicator creation with bootstrap.cc 'Message truncated : received "
     "256 bytes instead of 4' (PyTorch NGC 23.12); the reporter's fix was NCCL 2.18.6",
     "NVIDIA/nccl#1176"),
    ((2, 18, 1), (2, 18, 6), ("nccl-unhandled-cuda",),
     "NCCL 2.18 before 2.18.6 has a bug that ends in ncclUnhandledCudaError ('Call to CUDA function failed'), "
     "fixed in 2.18.6 (commit 4365458; torch 2.1's wheels bring 2.18.1)",
     "NVIDIA/nccl#1024"),
    ((2, 19, 3), (2, 20, 0), ("nccl-graph-mismatch",),
     "NCCL 2.19 left PCI link speeds uninitialized, so ranks could compute different rings or trees (graph/rings.cc "
     "'does not loop back to start'); fixed in NCCL 2.20",
     "NVIDIA/nccl#1020"),
)
"""Known NCCL release bugs, read against the 'NCCL version' a log prints."""

NCCL_OUTDATED = ((2, 0, 0),
                 "NCCL 1.x is the line before NCCL 2 (1.3.4 was its last open-source release, PCIe only; NCCL 2, "
                 "released in July 2017, replaced it); NCCL 1's tests and programs are not meant to run with NCCL 2 or the other "
                 "way round (a maintainer, NVIDIA/nccl#123): build everything against one current NCCL",
                 "NVIDIA/nccl#91, NVIDIA/nccl#123")
"""explain7: releases older than the first element are outdated: (first current release, the fact, its sources)."""

_NCCL = re.compile(r"NCCL version (\d+)\.(\d+)\.(\d+)")
# Any NCCL release a log names, with two or three numbers ("NCCL version 1.3.4", nccl-tests' "compiled with NCCL 1.0").
_NCCL_ANY = re.compile(r"\bNCCL (?:version )?(\d{1,2})\.(\d{1,3})(?:\.(\d{1,3}))?(?![\d.])")
_TORCH = re.compile(r"(?:\btorch==|PyTorch version:? |\btorch version:? |\btorch )(\d+)\.(\d+)\.(\d+)", re.I)


def _parse(rx: re.Pattern, lines: Sequence[str]) -> Optional[tuple]:
    for line in lines:
        if "ersion" in line or "torch" in line:
            m = rx.search(line[:4096])
            if m:
                return tuple(int(g) for g in m.groups())
    return None


def versions_in(lines: Sequence[str]) -> dict:
    """{"nccl": (2, 14, 3), "torch": (1, 13, 1)}: the first of each the log prints (absent: not printed)."""
    found = {"nccl": _parse(_NCCL, lines), "torch": _parse(_TORCH, lines)}
    return {k: v for k, v in found.items() if v}


def _dotted(v: tuple) -> str:
    return ".".join(str(x) for x in v)


def version_facts(lines: Sequence[str]) -> list:
    """The table's facts that apply to the versions in ``lines``, as sentences."""
    seen = versions_in(lines)
    facts = []
    nccl, torch = seen.get("nccl"), seen.get("torch")
    if nccl and nccl < NCCL_BF16:
        facts.append(f"The log shows NCCL {_dotted(nccl)}, older than 2.10.3: it has no bfloat16.")
    if torch:
        bundled = TORCH_BUNDLED_NCCL.get(f"{torch[0]}.{torch[1]}")
        if bundled and nccl and _dotted(nccl) != bundled:
            facts.append(f"torch {_dotted(torch)}'s wheels bring NCCL {bundled}, but the log shows NCCL {_dotted(nccl)}: "
                         "another NCCL is loaded (a container's, LD_LIBRARY_PATH, a second nvidia-nccl wheel).")
    return facts


def known_nccl_bug(lines: Sequence[str], family: str) -> str:
    """The sourced fact about a known bug of the NCCL release ``lines`` print, for a failure read as ``family``
    (``""``: no version printed, or no known bug of that release shows up that way)."""
    nccl = versions_in(lines).get("nccl")
    if not nccl:
        return ""
    for first, end, families, fact, source in NCCL_KNOWN_BUGS:
        if family in families and first <= nccl < end:
            return f"The log shows NCCL {_dotted(nccl)}: {fact} ({source})."
    return ""


def outdated_nccl(lines: Sequence[str]) -> str:
    """The sourced fact when ``lines`` name an NCCL release older than :data:`NCCL_OUTDATED`'s first (``""``: none)."""
    first, fact, source = NCCL_OUTDATED
    for line in lines:
        if "NCCL " in line:
            m = _NCCL_ANY.search(line[:4096])
            if m:
                seen = tuple(int(g or 0) for g in m.groups())
                if seen < first:
                    return f"The log shows NCCL {'.'.join(g for g in m.groups() if g)}: {fact} ({source})."
                return ""
    return ""
