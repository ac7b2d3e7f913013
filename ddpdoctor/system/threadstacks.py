"""Every thread's Python stack, read under the GIL by a thread of the process itself, on request.

Why not faulthandler from a signal: its all-threads dump runs in a signal handler and walks the other
threads' frames without the GIL while they run Python (a DataLoader's pin-memory thread, a user's data
thread), which can follow a frame being freed and crash the process it reads (SIGSEGV, CPython issue
116008; here a process with one busy thread died on its third read). A thread that takes the GIL and
reads ``sys._current_frames()`` sees every thread paused where it can be read whole. The signal stays
the fallback for a process whose thread does not answer: its GIL is held by C code that never lets
it go, and then no other thread runs Python, so the dump is safe.

Shared by the two sides that answer (``ddpdoctor run``'s injected hook, ``ddpdoctor check``'s workers)
and the two that ask (``ddpdoctor stacks`` and ``run``, ``check``'s supervisor). The protocol:

* the reader writes a fresh token (letters and digits) into the *request* (:func:`ask`): a named pipe
  (``check``'s workers) on which the answering thread waits, or a plain file (``run``'s hook, which
  several readers may ask) whose status the thread looks at ten times a second; idle, the thread
  costs nothing worth measuring;
* the answering thread (:func:`start_answering`) appends every thread's stack in faulthandler's
  format (:func:`format_stacks`) and the line ``# ddpdoctor stacks end <token>`` to the *answers*
  file, in one write;
* the reader finds its token's answer there (:func:`answered`); :func:`collect` asks several processes
  at once and waits for their answers.

Standard library only, and importable without the ddpdoctor package: ``ddpdoctor run`` copies this file
into the job's ``.inject`` folder as ``_ddpdoctor_threadstacks.py``, where the hook loads it (the job's
interpreter may not have ddpdoctor installed).
"""

import errno
import os
import stat
import sys
import threading
import time
import uuid

__all__ = ["END", "escaped", "format_stacks", "file_state", "is_fifo", "start_answering", "ask", "answered",
           "collect"]

END = "# ddpdoctor stacks end "  # + the request's token: the last line of an answer
MAX_FRAMES = 100  # per thread, as faulthandler
LOOK_EVERY = 0.1  # seconds between two looks at the request file


def escaped(s, limit=500):
    """``s`` as faulthandler writes names: printable ASCII kept, every other character escaped (``\\xNN``,
    ``\\uNNNN``, ``\\UNNNNNNNN``), cut at ``limit`` characters with ``...``."""
    out = []
    for ch in s[:limit]:
        n = ord(ch)
        out.append(ch if 32 <= n < 127 else f"\\x{n:02x}" if n <= 0xFF else f"\\u{n:04x}" if n <= 0xFFFF
                   else f"\\U{n:08x}")
    return "".join(out) + ("..." if len(s) > limit else "")


def format_stacks(main_id, skip=None):
    """Every thread's Python stack but ``skip``'s, in faulthandler's format (the main thread, ``main_id``,
    first, at most 100 frames each), read under the GIL: each thread is paused where it can be read
    whole, so the reading never follows a frame that is being freed."""
    frames = sys._current_frames()
    order = sorted((t for t in frames if t != skip), key=lambda t: t != main_id)
    parts = []
    for ident in order:
        lines = [f"Thread 0x{ident:016x} (most recent call first):"]
        frame, depth = frames[ident], 0
        while frame is not None:
            if depth == MAX_FRAMES:
                lines.append("  ...")
                break
            code = frame.f_code
            line = frame.f_lineno
            lines.append(f'  File "{escaped(code.co_filename)}", line {line if line is not None else "???"} '
                         f"in {escaped(code.co_name)}")
            frame, depth = frame.f_back, depth + 1
        parts.append("\n".join(lines) + "\n")
    frames = frame = None
    return "\n".join(parts)


def file_state(path):
    """(inode, mtime in ns, size) of ``path``, None when absent: a request file changed when this does."""
    try:
        st = os.stat(path)
        return st.st_ino, st.st_mtime_ns, st.st_size
    except OSError:
        return None


def is_fifo(path):
    """True when ``path`` is a named pipe (not followed through a link)."""
    try:
        return stat.S_ISFIFO(os.lstat(path).st_mode)
    except OSError:
        return False


def start_answering(request, answers, main_id, block=None, name="ddpdoctor-stacks"):
    """Start the daemon thread that answers the stack requests written to ``request`` by appending to
    ``answers`` (opened now, append-only, never through a link): the thread it returns.

    ``request`` a named pipe (``ddpdoctor check``'s workers: their supervisor makes it before the fork):
    the thread waits in ``open`` for a writer, so it answers at once and does nothing while idle; a
    reader whose ``open`` finds no thread waiting (``ENXIO``: it is answering, or has no GIL) tries
    again. Else a plain file's path (``ddpdoctor run``'s hook, asked by any number of readers that come
    and go): the thread looks at its status ten times a second. ``block``: the stack signal, blocked
    in this thread so that the kernel delivers it to the main thread (the fallback's dump then never
    runs here while the main thread's frames change)."""
    fd = os.open(answers, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    me = []

    def reply(token):
        if not token.isalnum():
            return  # a request being replaced, or not one of ddpdoctor's
        data = (format_stacks(main_id, me[0]) + END + token + "\n").encode("ascii", "replace")
        while data:  # one write in practice (O_APPEND): a reader sees the end line last
            data = data[os.write(fd, data):]

    def by_pipe():
        while True:
            try:
                with open(request, "rb", buffering=0) as f:  # waits (without the GIL) for a reader to write
                    words = f.readall()[:4096].decode("ascii", "replace").split()
            except FileNotFoundError:
                return  # the run's directory is gone: nobody will ask again
            except OSError:
                time.sleep(LOOK_EVERY)
                continue
            for token in words:
                try:
                    reply(token)
                except Exception:  # noqa: BLE001 - never break the process: the reader falls back to the signal
                    pass

    def by_status():
        last = file_state(request)
        while True:
            time.sleep(LOOK_EVERY)
            now = file_state(request)
            if now is None or now == last:
                continue
            last = now
            try:
                with open(request, "rb") as f:
                    token = f.read(64).decode("ascii", "replace").strip()
                reply(token)  # a partial token: the next look reads it whole
            except Exception:  # noqa: BLE001 - never break the process: the reader falls back to the signal
                pass

    loop = by_pipe if is_fifo(request) else by_status

    def answer():
        me.append(threading.get_ident())
        if block is not None:
            try:
                import signal

                signal.pthread_sigmask(signal.SIG_BLOCK, {block})
            except (AttributeError, OSError, ValueError):
                pass
        loop()

    thread = threading.Thread(target=answer, name=name, daemon=True)
    thread.start()
    return thread


def ask(request):
    """Ask for the stacks: a fresh token, written into ``request``; the token. A named pipe gets it
    without waiting (OSError ``ENXIO`` when no thread is waiting on it now: ask again, or give up);
    a plain file is written whole, then renamed into place (never through a link). Raises OSError when
    it cannot be written."""
    token = uuid.uuid4().hex[:16]
    if is_fifo(request):
        fd = os.open(request, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        try:
            os.write(fd, (token + "\n").encode())  # far below PIPE_BUF: whole, or not at all
        finally:
            os.close(fd)
        return token
    tmp = f"{request}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        os.replace(tmp, request)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return token


def answered(answers, start, token):
    """The stacks appended to ``answers`` (from byte ``start`` on) for ``token``, without the end line;
    None while that answer is not there (or the file cannot be read)."""
    try:
        with open(answers, encoding="utf-8", errors="replace") as f:
            f.seek(start)
            text = f.read()
    except OSError:
        return None
    end = text.find(END + token + "\n")
    if end < 0:
        return None
    begin = text.rfind(END, 0, end)  # an earlier request's answer, when two readers asked at once
    begin = 0 if begin < 0 else text.index("\n", begin) + 1
    return text[begin:end]


def collect(requests, patience, poll=0.05, alive=None):
    """Ask every process of ``requests`` (``{key: (request, answers)}``) at once and wait up to ``patience``
    seconds for their answers: ``({key: text}, {key: why})``, the answers that came and why a request could
    not be written. A named pipe whose thread is not waiting on it now (``ENXIO``: it is answering, or has
    no GIL) is asked again until the patience ends; ``alive(key)`` False ends the wait for that process."""
    started = time.monotonic()
    asked = dict.fromkeys(requests)  # key -> (offset in its answers, token) once asked
    answers, failed = {}, {}
    while True:
        for key, (request, where) in requests.items():
            if key in failed or asked[key] is not None:
                continue
            try:
                start = os.path.getsize(where)
            except OSError:
                start = 0
            try:
                asked[key] = (start, ask(request))
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    failed[key] = f"cannot write the stack request ({exc.strerror})"
        for key, got in asked.items():
            if got is not None and key not in answers:
                text = answered(requests[key][1], *got)
                if text is not None:
                    answers[key] = text
        waiting = [k for k in requests if k not in answers and k not in failed and (alive is None or alive(k))]
        if not waiting or time.monotonic() - started >= patience:
            return answers, failed
        time.sleep(poll)
