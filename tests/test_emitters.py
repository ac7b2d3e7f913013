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
FLOOR = {"torch": 890, "nccl": 599, "gloo": 115, "accelerate": 231, "torch-cpp": 313}


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


def test_cpp_messages():
    src = r'''
  TORCH_CHECK(x, "Expected ", a, ", got ", b);
  TORCH_CHECK_WITH(DistBackendError, false, "NCCL error in: " + std::string(__FILE__) + ":" + \\
      std::to_string(__LINE__) + ", " + err + "\n" + detail);
  TORCH_INTERNAL_ASSERT(false, "Expected to find key ", k, " in NCCL communicator map.");
  C10_THROW_ERROR(DistStoreError, fmt::format("Timed out after {} seconds waiting for clients.", s));
  REDUCER_CHECK(ok, logger_, "All parameters in a bucket must be ", "placed on the same device.");
  TORCH_WARN_ONCE("find_unused_parameters=True was specified in DDP constructor, "
                  "but did not find any unused parameters");
  LOG(ERROR) << "[Rank " << rank_ << "] NCCL watchdog thread terminated with exception: " << e.what();
  LOG(INFO) << "Reducer initialized with bucket_bytes_cap: " << cap;
  C10D_WARNING("The server socket has failed to bind to {} {}.", addr, err);
  C10D_INFO("The client socket has connected to {} on {}.", addr, s);
  std::string exceptionMsg = c10::str("[Rank ", rank_, "] Watchdog caught collective operation timeout: ",
      *this, " ran for ", ms, " milliseconds before timing out.");
  kBaseErrorMsg += "Since `find_unused_parameters=True` is enabled, this likely ";
  ss << "Incorrect output list size " << n << ". Output list size should be " << w;
'''
    assert extract._cpp_messages(src) == [
        ("raise", "Expected {}, got {}"), ("raise", "NCCL error in: {}:{}, {} {}"),
        ("raise", "Timed out after {} seconds waiting for clients."),
        ("raise", "All parameters in a bucket must be placed on the same device."),
        ("warn", "find_unused_parameters=True was specified in DDP constructor, but did not find any unused parameters"),
        ("c10d-W", "The server socket has failed to bind to {} {}."),
        ("log-E", "[Rank {}] NCCL watchdog thread terminated with exception: {}"),
        ("raise", "Incorrect output list size {}. Output list size should be {}"),
        ("raise", "[Rank {}] Watchdog caught collective operation timeout: {} ran for {} milliseconds before timing out."),
        ("raise", "Since `find_unused_parameters=True` is enabled, this likely ")]


def test_a_cpp_message_is_shown_as_c10d_prints_it():
    row = {"emitter": "torch-cpp", "file": "torch/csrc/distributed/c10d/reducer.cpp", "template": "Expected {}, got {}"}
    assert "Exception raised from f at ../torch/csrc/distributed/c10d/reducer.cpp:1 (most recent call first):" \
        in coverage.cpp_log_of(row)
    row["file"] += " (TORCH_WARN)"
    assert coverage.cpp_log_of(row).startswith("[rank0]:[W1125 02:26:31.059000000 24546 reducer.cpp:1] Warning: Expected x")


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
    assert set(by) == {"torch", "nccl", "gloo", "accelerate", "torch-cpp"}
    for emitter, versions in by.items():
        if emitter == "torch-cpp":  # read file by file: each file at one version, the release or a main commit
            assert all(re.fullmatch(r"\d+\.\d+\.\d+ \([0-9a-f]{7}\)|main@[0-9a-f]{12}", v) for v in versions), versions
            per_file = {}
            for row in rows:
                if row["emitter"] == emitter:
                    per_file.setdefault(row["file"].split(" ")[0], set()).add(row["version"])
            assert all(len(v) == 1 for v in per_file.values()), per_file
            continue
        assert len(versions) == 1, f"{emitter}: one pinned version, not {versions}"
        assert re.fullmatch(r"v?[\w.+-]+", next(iter(versions)))


def test_coverage_does_not_fall():
    measured = coverage.measure()
    low = {e: (measured[e][0], floor) for e, floor in FLOOR.items() if measured[e][0] < floor}
    assert not low, f"templates covered (now, floor): {low}"


def test_an_nccl_warn_is_matched_in_its_line_form():
    row = {"emitter": "nccl", "file": "src/transport/nvls.cc", "template": "Cuda failure {} '{}'"}
    assert "host:1:2 [0] transport/nvls.cc:1 NCCL WARN Cuda failure x 'x'" == coverage.shown(row)[1]
