"""The work a rank did, as ``ddpdoctor run``'s hang detector counts it: CPU time and bytes read or
written by the rank and its children (DataLoader workers), *less ddpdoctor's own work inside it*.

Nothing ddpdoctor does inside a rank may count as progress, or a look at a hung job would restart its
hang clock. What the injected hook does there, and how each is taken out at its cause:

* its heartbeat thread (looks at the main thread's frames, writes ``beat-``, ``coll-``, ``proc-``
  files) and its two Flight Recorder threads (write ``flight-recorder-rank<N>`` and ``frdump-<pid>.json``
  when ``run`` or ``stacks`` asks, and ``frprog-<pid>.json``, the collectives' progress, at most twice a
  second) and its stack thread (answers ``stackreq-<pid>`` in ``stackans-<pid>.txt``): the rank's CPU
  time and I/O are summed over its other threads, read per thread from ``/proc/<pid>/task/<tid>/``
  (ddpdoctor's thread ids are in ``proc-<pid>.json`` as ``own_threads``). The dumps' bytes are taken out there, at the thread that wrote them, not again by file
  size: subtracting them twice would change the count, and any change counts as progress;
* stack dumps (faulthandler, on whichever thread takes the signal, at a ``ddpdoctor stacks`` or
  ``run`` request): the bytes it wrote are exactly what ``stacks-<pid>.txt`` holds, subtracted.
  Its CPU time (well under a millisecond a dump) stays below what counts as busy (``CPU_MIN_S``).

Not ddpdoctor's, but not the job's work either: the dump torch itself writes on a timeout
(``TORCH_NCCL_DUMP_ON_TIMEOUT``, from NCCL's watchdog thread), taken out by ``run`` from the file's
changes (``_Watch._torch_dump_bytes`` in :mod:`ddpdoctor.postmortem.jobrun`).
"""

from __future__ import annotations

import os

__all__ = ["usage"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _thread_cpu(pid: int, tid: int) -> float:
    """CPU seconds (user + system) of one thread, 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(b")") + 2:].split()  # fields 3.. of proc(5): utime, stime are 14 and 15
    try:
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (IndexError, ValueError):
        return 0.0


def _thread_io(pid: int, tid: int) -> int:
    """Bytes read + written (``rchar`` + ``wchar``) by one thread, 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/io", "rb") as f:
            text = f.read()
    except OSError:
        return 0
    total = 0
    for line in text.splitlines():
        key, _, value = line.partition(b":")
        if key in (b"rchar", b"wchar"):
            total += int(value)
    return total


def usage(pid: int, own_threads=(), own_files=()) -> tuple:
    """CPU seconds and bytes read+written by ``pid`` and its descendants, less ddpdoctor's own: the
    threads ``own_threads`` (thread ids in ``pid``) and the bytes in ``own_files`` (written by ``pid``
    for ddpdoctor: its stack dumps).

    ``pid``'s own part is the sum over its other threads, each read once: the process's total less the
    own threads' counters, read a moment later, would count what an own thread did in between (a Flight
    Recorder dump's second of CPU, a stack answer's bytes) as the job's, and a look at a hung job would
    then restart its hang clock."""
    import psutil  # here, not at the top: the wrapper starts the job before its first sample

    cpu, io = 0.0, 0
    try:
        me = psutil.Process(pid)
        children = me.children(recursive=True)
    except psutil.Error:
        return cpu, io
    own = {t for t in own_threads if isinstance(t, int) and t > 0}
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit()]
    except OSError:
        return cpu, io
    for tid in tids:
        if tid not in own:
            cpu += _thread_cpu(pid, tid)
            io += _thread_io(pid, tid)
    for q in children:
        try:
            with q.oneshot():
                t = q.cpu_times()
                cpu += t.user + t.system
                c = q.io_counters()
                io += c.read_chars + c.write_chars
        except (psutil.Error, AttributeError):
            continue
    for path in own_files:
        try:
            io -= os.path.getsize(path)
        except OSError:
            pass
    return cpu, io
