"""Injected by ``ddpdoctor run`` (PYTHONPATH) into every Python process of the job; not imported otherwise.

In each rank (a process with ``RANK`` in its environment that is not a child of another rank, or
the launched command itself when it sets none) it:

* registers :mod:`faulthandler` on ``DDPDOCTOR_STACK_SIGNAL`` (SIGUSR2 by default) to append the
  stacks of all threads to ``$DDPDOCTOR_RUN_DIR/stacks-<pid>.txt`` when asked (no change to the
  user's code, works while the rank is blocked inside C++);
* starts one daemon thread that looks at the main thread's innermost frame every
  ``DDPDOCTOR_BEAT_S`` seconds (1 by default) and bumps a counter in ``beat-<pid>`` when it moved:
  the cheap progress signal the supervisor watches;
* writes ``proc-<pid>.json`` (pid, rank, local rank, argv) so the supervisor finds its ranks.

Then it imports the ``sitecustomize`` that was next on the path, if any. It imports nothing from
torch or ddpdoctor, and never raises: a failure here must not break the user's job.
"""

import os
import sys


def _ddpdoctor_is_rank():
    rank = os.environ.get("RANK")
    marker = os.environ.get("DDPDOCTOR_RANK_MARK")
    if rank is not None:
        if marker and marker.split(":")[0] == rank:
            return False  # a child (spawned DataLoader worker, subprocess) of a rank
        os.environ["DDPDOCTOR_RANK_MARK"] = f"{rank}:{os.getpid()}"
        return True
    return os.environ.get("DDPDOCTOR_RUN_PID") == str(os.getppid())


def _ddpdoctor_install():
    import atexit
    import faulthandler
    import json
    import signal
    import threading

    run_dir = os.environ["DDPDOCTOR_RUN_DIR"]
    pid = os.getpid()
    signame = os.environ.get("DDPDOCTOR_STACK_SIGNAL", "SIGUSR2")
    stack_file = open(os.path.join(run_dir, f"stacks-{pid}.txt"), "a")
    faulthandler.register(getattr(signal, signame), file=stack_file, all_threads=True, chain=False)
    beat_path = os.path.join(run_dir, f"beat-{pid}")
    beat_fd = os.open(beat_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    interval = float(os.environ.get("DDPDOCTOR_BEAT_S", "1.0"))
    main_id = threading.main_thread().ident

    stop = threading.Event()

    def beat():
        last, count = None, 0
        while not stop.wait(interval):
            frame = sys._current_frames().get(main_id)
            if frame is None:
                return
            here = (id(frame.f_code), frame.f_lineno, id(frame.f_back.f_code) if frame.f_back else 0,
                    frame.f_back.f_lineno if frame.f_back else 0)
            frame = None
            if here != last:
                last, count = here, count + 1
                os.pwrite(beat_fd, b"%012d\n" % count, 0)

    thread = threading.Thread(target=beat, name="ddpdoctor-heartbeat", daemon=True)
    thread.start()

    def finish():  # end the thread before the interpreter finalizes (no daemon thread at teardown)
        stop.set()
        thread.join(timeout=2)

    atexit.register(finish)
    info = {"pid": pid, "ppid": os.getppid(), "rank": os.environ.get("RANK"),
            "local_rank": os.environ.get("LOCAL_RANK"), "argv": list(getattr(sys, "argv", []) or []),
            "signal": signame, "main_thread": main_id, "stack_file": stack_file.name, "beat_file": beat_path}
    tmp = os.path.join(run_dir, f".proc-{pid}.json")
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, os.path.join(run_dir, f"proc-{pid}.json"))
    sys.modules["_ddpdoctor_injected"] = sys.modules[__name__]
    globals()["_ddpdoctor_keep"] = (stack_file, beat_fd)


def _ddpdoctor_chain():
    """Import the sitecustomize this one shadows, so the user's own still runs."""
    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import importlib

        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        if me is not None and "sitecustomize" not in sys.modules:
            sys.modules["sitecustomize"] = me


if os.environ.get("DDPDOCTOR_RUN_DIR"):
    try:
        if _ddpdoctor_is_rank():
            _ddpdoctor_install()
    except Exception as exc:  # noqa: BLE001 - never break the user's job
        sys.stderr.write(f"ddpdoctor: stack handler not installed: {exc}\n")
_ddpdoctor_chain()
