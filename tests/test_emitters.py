"""The emitters' templates (tests/data/emitters, issue 25): the extractor reads each kind of source right,
the checked-in list is well formed and pinned, and the catalogue's coverage of it does not fall.

Regenerate the list with ``tests/data/emitters/extract.py`` (see its docstring); print the coverage with
``python tests/data/emitters/coverage.py``.
"""

from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "emitters"))

import coverage  # noqa: E402
import extract  # noqa: E402

# The coverage measured when the catalogue last changed (covered templates per emitter): it may only rise.
FLOOR = {"torch": 890, "nccl": 599, "gloo": 115, "accelerate": 231}


def test_python_messages():
    src = '''
def f(x, n):
    if x:
        raise RuntimeError(f"rank {n} saw {x!r} twice")
    raise ValueError("size %d of %s" % (n, x))
    warnings.warn("deprecated: use {} instead".format(x))
    logger.warning("Sending process %s closing signal %s", n, x)
    self._log_and_throw(ValueError, "DistributedDataParallel is not needed " + "when a module")
    raise KeyError(x)
'''
    assert sorted(extract._py_messages(src)) == sorted([
        "rank {} saw {} twice", "size {} of {}", "deprecated: use {} instead",
        "Sending process {} closing signal {}", "DistributedDataParallel is not needed when a module"])


def test_c_messages():
    src = r'''
  WARN("NET/IB : %s:%d Got async event : %s", dev, port, str);
  if (x) { WARN("Cuda failure %d '%s'", err, cudaGetErrorString(err)); }
  GLOO_ENFORCE_EQ(a, b, "Mismatch in size: ", a, " vs ", b);
  GLOO_ENFORCE(pair != nullptr, "pair missing (index ", rank, ")");
  GLOO_ENFORCE(ok);
'''
    nccl = extract._c_messages(src, extract.NCCL_MACROS)
    assert nccl == ["NET/IB : {}:{} Got async event : {}", "Cuda failure {} '{}'"]
    gloo = extract._c_messages(src, extract.GLOO_MACROS)
    assert gloo == ["Mismatch in size: {} vs {}", "pair missing (index {})"]


def test_nccl_error_strings():
    src = 'const char* ncclGetErrorString(ncclResult_t code) {\n switch (code) {\n' \
          ' case ncclSuccess : return "no error";\n case ncclSystemError : return "unhandled system error";\n'
    assert extract._nccl_error_strings(src) == ["no error", "unhandled system error"]


def test_the_list_is_pinned_and_well_formed():
    rows = coverage.load()
    assert len(rows) > 1000
    by = {}
    for row in rows:
        assert set(row) == {"emitter", "file", "version", "template"}, row
        assert row["template"] and "\t" not in row["template"]
        by.setdefault(row["emitter"], set()).add(row["version"])
    assert set(by) == {"torch", "nccl", "gloo", "accelerate"}
    for emitter, versions in by.items():
        assert len(versions) == 1, f"{emitter}: one pinned version, not {versions}"
        assert re.fullmatch(r"v?[\w.+-]+", next(iter(versions)))


def test_coverage_does_not_fall():
    measured = coverage.measure()
    low = {e: (measured[e][0], floor) for e, floor in FLOOR.items() if measured[e][0] < floor}
    assert not low, f"templates covered (now, floor): {low}"


def test_an_nccl_warn_is_matched_in_its_line_form():
    row = {"emitter": "nccl", "file": "src/transport/nvls.cc", "template": "Cuda failure {} '{}'"}
    assert "host:1:2 [0] transport/nvls.cc:1 NCCL WARN Cuda failure x 'x'" == coverage.shown(row)[1]
