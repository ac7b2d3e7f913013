"""The job's output under ``ddpdoctor run``: passed through to ours byte for byte, and copied to the raw log.

The job's output never waits on ddpdoctor's own copy of it. Each stream is pumped by one thread that
writes each chunk to the terminal first and then hands it to the log's writer thread through a
bounded queue; a log write that fails (a full disk) or a log that falls more than
:data:`LOG_BACKLOG` bytes behind (a stalled file system) costs only the copy: what could not be
saved is counted, said in one line at the end, and the job goes on writing at full speed.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import IO, Optional

__all__ = ["OutputCopy", "LOG_BACKLOG"]

LOG_BACKLOG = 32 << 20  # bytes the log may fall behind the terminal before chunks are dropped from the copy


class OutputCopy:
    """Copies the job's stdout/stderr byte for byte to ours and to the raw log; counts bytes (progress).

    Args:
        log_path: the raw log (created user-only, appended to, never through a link).

    Raises:
        OSError: the log cannot be created.
    """

    def __init__(self, log_path: str) -> None:
        self.log_path = log_path
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        self.log_fd = fd
        self.lock = threading.Lock()
        self.bytes = 0  # read from the job (the hang clock's "the job wrote output")
        self.saved = 0  # of them, written to the log
        self.error = ""  # why the log stopped (the first failure), if it did
        self.backlog = 0
        self.passed = True  # every chunk reached our stdout/stderr
        self.threads: list = []
        self.pipes: list = []
        self.chunks: queue.Queue = queue.Queue()
        self.writer = threading.Thread(target=self._write_log, name="ddpdoctor-log", daemon=True)
        self.writer.start()

    def start(self, pipe: IO[bytes], sink: Optional[IO[bytes]]) -> None:
        """Pump ``pipe`` to ``sink`` (None: nowhere) and to the log until end-of-file."""
        t = threading.Thread(target=self._pump, args=(pipe, sink), name="ddpdoctor-output", daemon=True)
        t.start()
        self.threads.append(t)
        self.pipes.append(pipe)

    def _pump(self, pipe: IO[bytes], sink: Optional[IO[bytes]]) -> None:
        fd = pipe.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            with self.lock:
                self.bytes += len(chunk)  # progress, even while our terminal is slow to take it
            if sink is not None:
                try:
                    sink.write(chunk)
                    sink.flush()
                except (OSError, ValueError):  # our stdout is gone: the job still runs, the log still copies
                    sink, self.passed = None, False
            with self.lock:
                if self.error or self.backlog + len(chunk) > LOG_BACKLOG:
                    # from here on the log stops: a log with a hole in it would mislead more than a short one
                    self.error = self.error or f"the log fell more than {LOG_BACKLOG >> 20} MiB behind"
                    continue
                self.backlog += len(chunk)
            self.chunks.put(chunk)

    def _write_log(self) -> None:
        while True:
            chunk = self.chunks.get()
            if chunk is None:  # the end: the log is closed here, after its last write (however late)
                try:
                    os.close(self.log_fd)
                except OSError as exc:
                    with self.lock:
                        self.error = self.error or exc.strerror or str(exc)
                return
            with self.lock:
                failed = bool(self.error)
            view = memoryview(chunk)
            while view and not failed:
                try:
                    n = os.write(self.log_fd, view)  # a full disk: part of it, then ENOSPC
                except OSError as exc:
                    with self.lock:
                        self.error = exc.strerror or str(exc)
                    break
                view = view[n:]
                with self.lock:
                    self.saved += n
            with self.lock:
                self.backlog -= len(chunk)

    def close(self, wait: float = 5.0) -> bool:
        """Wait up to ``wait`` s for the job's output to end (its pipes at end-of-file) and the log to
        catch up; True when both did. A pipe still held open by a process the job left is let go."""
        import time

        deadline = time.monotonic() + wait
        for t in self.threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        ended = not any(t.is_alive() for t in self.threads)
        if ended:
            for pipe in self.pipes:
                pipe.close()
        self.chunks.put(None)
        self.writer.join(timeout=max(0.5, deadline - time.monotonic()))
        return ended and not self.writer.is_alive()

    def unsaved(self) -> Optional[str]:
        """One line on what the log is missing, or None when it holds all the job's output."""
        with self.lock:
            if not self.error and self.saved >= self.bytes:
                return None
            return (f"ddpdoctor run: {os.path.basename(self.log_path)} is incomplete: {_size(self.saved)} of "
                    f"{_size(self.bytes)} of the job's output saved ({self.error or 'still being written'})"
                    + ("; the output itself passed through in full" if self.passed else ""))


def _size(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.0f} KiB"
    return f"{n} bytes"
