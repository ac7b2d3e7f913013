"""Injected by ``ddpdoctor run`` (PYTHONPATH) into every Python process of the job; not imported otherwise.

Which processes are ranks (each registers itself; the others only chain to the next sitecustomize):

* a process with ``RANK`` in its environment that is not a child of another rank (torchrun, srun,
  mpirun, ``torch.distributed.launch``);
* a ``multiprocessing`` child that is not below a rank: an ``mp.spawn`` / ``start_processes`` /
  ``multiprocessing.Process`` child started with *spawn* or *forkserver* (its command line ends in
  ``--multiprocessing-fork``), or forked (``os.fork`` without exec) from the launched command. Its rank
  number comes from the process group once ``init_process_group`` ran (``get_rank()``), before that
  from ``mp.spawn``'s process index. multiprocessing's resource tracker and forkserver are not ranks;
* the launched command itself registers as ``top`` (a single-process job, or the ``mp.spawn`` parent),
  a torchrun-like agent as ``launcher``. ``run`` watches them only when no rank is alive.

In each registered process it:

* starts a daemon thread that appends every thread's stack to ``$DDPDOCTOR_RUN_DIR/stackans-<pid>.txt``
  when ``stackreq-<pid>`` changes, read under the GIL (:func:`_ddpdoctor_stack_thread`); readers send
  the signal below only when that thread does not answer (the GIL held by stuck C code);
* registers :mod:`faulthandler` on ``DDPDOCTOR_STACK_SIGNAL`` (SIGUSR2 by default) to append the
  stacks of all threads to ``$DDPDOCTOR_RUN_DIR/stacks-<pid>.txt`` when asked, *before* it announces
  itself (so no signal is sent before the handler exists); the action it replaces is *ignore* (set
  just before), so when faulthandler lets go (our atexit, or the interpreter's finalization) the
  signal is ignored, never fatal: a stack request racing with a normal exit cannot kill the process;
* starts one daemon thread that looks at the main thread's innermost frames every
  ``DDPDOCTOR_BEAT_S`` seconds (1 by default) and bumps a counter in ``beat-<pid>`` when they moved
  (the cheap progress signal the supervisor watches), and fills in the rank number when it learns it;
* times every collective (straggler scores, ``ddpdoctor.locate.straggler``): once ``torch.distributed``
  is imported, its blocking collectives are wrapped (two clock reads and an append per call), and
  DDP's gradient all-reduce, which runs in C++, is reached through autograd: at its first forward
  each DDP model gets a hook on its last parameter's gradient (the first that backward reaches: the
  backward starts), which queues an end-of-backward callback that queues one more, so the last runs
  after DDP's own (which waits for the all-reduce): the interval is the backward and the gradient
  sync, three Python calls per step (about 10 us). Not a communication hook: a Python one costs a
  cross-thread handoff per bucket (300-450 us of CPU per step, 5-10% of a small model's step on a
  busy machine, benchmarks/bench_straggler.py), and the program keeps ``register_comm_hook`` for
  itself, before or after its first forward. Each call gets the rank's own number (1, 2, ...), its
  operation (the function's name; ``ddp_backward_sync`` for DDP's backward and gradient sync) and its
  size (the bytes of the first tensor argument; DDP's: its gradients' bytes); an optimizer step
  pre-hook records when each step started. The heartbeat appends the lines ``start end op bytes n``,
  ``step start n`` and, for a call still running at a beat, ``open start op bytes n`` (monotonic
  seconds) to ``coll-<pid>.txt``, read by the straggler watch and by
  the run's timeline (``trace.json``, ``report.html``). ``DDPDOCTOR_STRAGGLER=0`` turns all of it off. The same wrappers mark the
  collective the main thread is in (``_ddpdoctor_waiting``: its start and name; DDP's forward and
  backward too) for the ``solo-wait`` watch, which keeps them on without ``DDPDOCTOR_STRAGGLER``;
* in ranks, starts the watches for silent bugs (:mod:`_ddpdoctor_watches`, copied next to this file;
  ``DDPDOCTOR_WATCH_<NAME>=0`` turns one off), which the heartbeat thread calls every beat;
* in a rank, starts a second daemon thread that writes the rank's PyTorch Flight Recorder dump
  (``flight-recorder-rank<N>``, and ``frdump-<pid>.json`` saying what it answered) when ``fr-request``
  in the run directory changes (``run`` on a hang, a death or Ctrl-C; ``stacks``): a thread, because a
  Python signal handler does not run while the main thread is blocked in a C++ collective. A rank that
  raises or exits non-zero writes its dump (without stacks) from the exception and exit handlers. Once
  torch.distributed is imported, the same thread writes the collectives' progress (``frprog-<pid>.json``,
  at most twice a second) for ``run``'s hang detector. The code that dumps lives in
  ``_ddpdoctor_recorder.py`` beside this file, loaded only once torch.distributed is imported;
* writes ``proc-<pid>.json`` (pid, role, rank, argv, ...) so the supervisor finds it, and
  ``exit-<pid>.json`` when it ends through Python (an uncaught exception with its frames, ``sys.exit``'s
  or ``os._exit``'s code, or a normal end): a rank with no exit record was ended by a signal. The
  arguments and the exception's words go through ddpdoctor's redaction (``ddpdoctor/system/redact.py``,
  loaded by its path, ``DDPDOCTOR_REDACT_PY``: this interpreter may not have ddpdoctor installed);
  where it cannot be loaded, the arguments are left out.

Then it imports the ``sitecustomize`` that was next on the path, if any. It imports nothing from
torch, nor the ddpdoctor package (only standard-library-only modules, by path: ``redact.py``, and the
stack thread's ``_ddpdoctor_threadstacks.py`` beside this file, a copy of ``system/threadstacks.py``),
and never raises: a failure here must not break the user's job.
"""

import os
import sys


def _ddpdoctor_role():
    """``rank``, ``spawn``, ``top``, ``launcher`` or None (not watched)."""
    env = os.environ
    marker = env.get("DDPDOCTOR_RANK_MARK")
    rank = env.get("RANK")
    if rank is not None:
        if marker and marker.split(":")[0] in (rank, "spawn"):
            return None  # a child (spawned DataLoader worker, subprocess) of a rank
        env["DDPDOCTOR_RANK_MARK"] = f"{rank}:{os.getpid()}"
        return "rank"
    argv = list(getattr(sys, "argv", []) or [])
    if "--multiprocessing-fork" in argv:
        if marker:
            return None  # a multiprocessing child of a rank (DataLoader worker with spawn)
        env["DDPDOCTOR_RANK_MARK"] = f"spawn:{os.getpid()}"
        return "spawn"
    if env.get("DDPDOCTOR_RUN_PID") == str(os.getppid()):
        try:
            with open("/proc/self/cmdline", "rb") as f:
                words = [w.decode(errors="replace") for w in f.read().split(b"\0")[:4]]
        except OSError:
            words = argv[:3]
        launchers = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "accelerate", "deepspeed")
        if any(os.path.basename(w) in launchers or w in launchers for w in words):
            return "launcher"
        return "top"
    return None


_ddpdoctor_state = {}


def _ddpdoctor_redaction():
    """ddpdoctor's redaction module, loaded by path (``DDPDOCTOR_REDACT_PY``), or None."""
    path = os.environ.get("DDPDOCTOR_REDACT_PY")
    if not path:
        return None
    try:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_ddpdoctor_redact", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.redact_argv(["--token", "x"])  # usable in this interpreter, or not at all
        return module
    except Exception:  # noqa: BLE001 - an older interpreter, an unreadable file: leave the arguments out
        return None


def _ddpdoctor_write_json(name, data):
    import json

    run_dir = os.environ["DDPDOCTOR_RUN_DIR"]
    tmp = os.path.join(run_dir, f".{name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(run_dir, name))


def _ddpdoctor_spawn_index(frame):
    """mp.spawn's process index: the ``i`` of torch's ``_wrap(fn, i, args, error_file)`` on the stack."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_wrap" and code.co_filename.replace("\\", "/").endswith("multiprocessing/spawn.py"):
            value = frame.f_locals.get("i")
            return value if isinstance(value, int) else None
        frame = frame.f_back
    return None


def _ddpdoctor_learn_rank(info, main_frame):
    """Fill in the rank from the process group (or mp.spawn's index); True when the record changed."""
    changed = False
    if info.get("pg_rank") is None:
        td = sys.modules.get("torch.distributed")
        try:
            if td is not None and td.is_available() and td.is_initialized():
                info["pg_rank"] = int(td.get_rank())
                info["world_size"] = int(td.get_world_size())
                changed = True
        except Exception:  # noqa: BLE001 - a half-initialized module: try again next beat
            pass
    if info.get("index") is None and info["role"] == "spawn" and main_frame is not None:
        index = _ddpdoctor_spawn_index(main_frame)
        if index is not None:
            info["index"] = index
            changed = True
    if changed and info.get("rank") is None:
        info["rank"] = info["pg_rank"] if info.get("pg_rank") is not None else info.get("index")
    return changed


_DDPDOCTOR_TIMED = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                    "broadcast", "barrier", "all_to_all", "all_to_all_single", "reduce")


def _ddpdoctor_loaded(name):
    """The module once its import has finished (a background thread must not patch a half-built one)."""
    mod = sys.modules.get(name)
    spec = getattr(mod, "__spec__", None)
    return None if mod is None or getattr(spec, "_initializing", False) else mod


_ddpdoctor_waiting = [None]  # (monotonic start, what): the collective the main thread is in (solo-wait)


def _ddpdoctor_on_import(name, then):
    """Call ``then(module)`` right after ``name`` is executed, when it is first imported: a finder first on
    ``sys.meta_path`` that wraps that one module's loader (every other import goes by at one comparison),
    and takes itself off when done. So collectives are timed and marked from the first one: a rank that
    hangs at the barrier right after ``init_process_group`` would come before the heartbeat's next beat."""

    class Finder:
        @staticmethod
        def find_spec(fullname, path=None, target=None):
            if fullname != name:
                return None
            try:
                sys.meta_path.remove(Finder)
            except ValueError:
                pass
            try:
                import importlib.util

                spec = importlib.util.find_spec(fullname)
                loader = getattr(spec, "loader", None)
                real = getattr(loader, "exec_module", None)
                if real is None:
                    return spec

                def exec_module(module):
                    real(module)
                    try:
                        then(module)
                    except Exception:  # noqa: BLE001 - never break the job's import
                        pass

                loader.exec_module = exec_module
                return spec
            except Exception:  # noqa: BLE001 - the normal import goes on
                return None

    sys.meta_path.insert(0, Finder)


def _ddpdoctor_time_collectives(events, inflight, c10d=None):
    """Wrap torch.distributed's blocking collectives and DDP's all-reduce; True once done. ``inflight[0]``:
    the call in progress (start, op, bytes, n), None between calls: the heartbeat writes it once, so a
    collective that never completes (a hang) is on the timeline too. ``c10d``: the module just executed,
    from the import hook (:func:`_ddpdoctor_on_import`), while its package is still being imported: then
    only its functions are wrapped, and the package copies the wrapped ones; the heartbeat does the rest."""
    import threading
    import time

    waiting = _ddpdoctor_waiting
    main, ident = threading.main_thread().ident, threading.get_ident  # a collective of another thread: not marked

    package = _ddpdoctor_loaded("torch.distributed")
    c10d = c10d or _ddpdoctor_loaded("torch.distributed.distributed_c10d")
    if c10d is None:
        return False
    clock = time.monotonic
    count = _ddpdoctor_state.setdefault("timed_count", [0])  # this rank's timed calls so far: each one's number

    def nbytes(x):
        # the bytes of a tensor, or of a list of tensors (all_gather's output): numel and element_size only
        try:
            if isinstance(x, (list, tuple)):
                return sum(t.numel() * t.element_size() for t in x)
            return x.numel() * x.element_size()
        except Exception:  # noqa: BLE001 - not a tensor (barrier, an object collective): no size
            return 0

    def wrap(real):
        op = getattr(real, "__name__", "collective")

        def timed(*args, **kwargs):
            if kwargs.get("async_op"):
                return real(*args, **kwargs)  # completes later, at wait(): not timed
            count[0] += 1
            call = inflight[0] = (clock(), op, nbytes(args[0]) if args else 0, count[0])
            mine = ident() == main
            if mine:
                held, waiting[0] = waiting[0], (call[0], op)
            try:
                return real(*args, **kwargs)
            finally:
                if mine:
                    waiting[0] = held
                inflight[0] = None
                events.append((call[0], clock(), *call[1:]))
        timed.__wrapped__ = real
        timed.__name__ = op
        timed.__doc__ = getattr(real, "__doc__", None)
        timed._ddpdoctor_timed = True
        return timed

    for name in _DDPDOCTOR_TIMED:
        real = getattr(c10d, name, None)
        if real is None or getattr(real, "_ddpdoctor_timed", False):
            continue
        timed = wrap(real)
        setattr(c10d, name, timed)
        if package is not None and getattr(package, name, None) is real:
            setattr(package, name, timed)
    if package is None:
        return False  # the package is still being imported: the heartbeat comes back
    parallel = _ddpdoctor_loaded("torch.nn.parallel.distributed")
    if parallel is None:
        return False  # DDP may be imported later: come back
    ddp = getattr(parallel, "DistributedDataParallel", None)
    if ddp is None or getattr(ddp.forward, "_ddpdoctor_timed", False):
        return True
    torch = sys.modules["torch"]
    queue = torch.autograd.Variable._execution_engine.queue_callback
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
    real_forward = ddp.forward
    grads = [0]  # bytes of the last hooked model's gradients: what DDP's all-reduce moves per step

    def backward_started(grad):
        # The gradient of the model's last parameter (the first that backward reaches): the backward has
        # started. DDP's reducer queues its own end-of-backward callback (which waits for the last
        # buckets' all-reduce) when its last bucket is ready, later in this backward; callbacks run in
        # order, and one queued while they run goes last: so the second of ours runs after DDP's wait.
        count[0] += 1
        call = inflight[0] = (clock(), "ddp_backward_sync", grads[0], count[0])
        waiting[0] = (call[0], "DDP's backward (its gradient all-reduce)")

        def done():
            waiting[0] = None
            inflight[0] = None
            events.append((call[0], clock(), *call[1:]))

        queue(lambda: queue(done))

    def forward(self, *args, **kwargs):
        if "_ddpdoctor_hooked" not in self.__dict__:
            try:
                # compiled autograd (DDP's Python reducer) or a forward being traced: leave their graphs alone
                if not self.__dict__.get("_use_python_reducer") and not compiling():
                    self.__dict__["_ddpdoctor_hooked"] = True
                    params = [p for p in self.module.parameters() if p.requires_grad]
                    if params:  # once per model: a hook on a parameter stays (one per step: 3x the cost)
                        grads[0] = sum(nbytes(p) for p in params)
                        params[-1].register_hook(backward_started)
            except Exception:  # noqa: BLE001 - never break the job
                pass
        waiting[0] = (clock(), "DDP's forward (its buffer broadcast)")  # a backward that raised left its mark
        try:
            return real_forward(self, *args, **kwargs)
        finally:
            waiting[0] = None

    forward._ddpdoctor_timed = True
    forward.__wrapped__ = real_forward
    ddp.forward = forward
    return True


def _ddpdoctor_time_steps(events):
    """A global optimizer step pre-hook that records when each step starts (one clock read and an append):
    the timeline's steps. True once installed (``torch.optim.optimizer`` fully imported), or when it
    never can be (a torch without global step hooks)."""
    import time

    optimizer = _ddpdoctor_loaded("torch.optim.optimizer")
    if optimizer is None:
        return False
    clock = time.monotonic
    steps = [0]

    def step_started(*_args):
        steps[0] += 1
        events.append(("step", clock(), steps[0]))

    try:
        optimizer.register_optimizer_step_pre_hook(step_started)
    except Exception:  # noqa: BLE001 - no global step hooks: no steps on the timeline
        pass
    return True


def _ddpdoctor_recorder():
    """The hook's Flight Recorder module (``_ddpdoctor_recorder.py`` beside this file), loaded on first use
    by path (the job's own ``sys.path`` may have changed); None when it is absent."""
    mod = _ddpdoctor_state.get("recorder")
    if mod is None:
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ddpdoctor_recorder.py")
        if not os.path.exists(path):
            return None
        spec = importlib.util.spec_from_file_location("_ddpdoctor_recorder", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _ddpdoctor_state["recorder"] = mod
    return mod


def _ddpdoctor_dump_recorder(run_dir, why, token="", stages=("quick", "full")):
    """This rank's Flight Recorder dump (see ``_ddpdoctor_recorder.py``), only where torch.distributed is in
    use; at an exit or a raise at most once, and without stacks (the stacks take seconds: a failing rank's
    end is not delayed; its exit record holds its traceback), and not when a dump was asked for in the last
    60 seconds: that one shows the collectives as they hung; one written after the interrupt or
    the peer's death that made this rank raise would show them torn down. Never raises."""
    try:
        import time

        if why != "request":
            if "recorder_exit" in _ddpdoctor_state or "torch.distributed" not in sys.modules:
                return
            _ddpdoctor_state["recorder_exit"] = True
            if time.monotonic() - _ddpdoctor_state.get("recorder_asked", -1e9) < 60.0:
                return
        else:
            _ddpdoctor_state["recorder_asked"] = time.monotonic()
        mod = _ddpdoctor_recorder()
        if mod is not None:
            mod.dump(run_dir, why, token, stages)
    except Exception:  # noqa: BLE001 - never break the job
        pass


def _ddpdoctor_file_state(path):
    """(inode, mtime in ns, size) of ``path``, None when absent: a request file changed when this does."""
    try:
        st = os.stat(path)
        return st.st_ino, st.st_mtime_ns, st.st_size
    except OSError:
        return None


def _ddpdoctor_recorder_thread(run_dir, signum, interval, progress_s=0.0):
    """Two daemon threads that dump the Flight Recorder when ``run`` or ``stacks`` asks (``fr-request``
    changed): threads, because a Python signal handler does not run while the main thread is blocked in
    a C++ collective; not the heartbeat's, so a slow dump never stops the beat. The first writes the
    quick dump (no stacks) at once and hands the request to the second, which writes the dump with
    stacks (seconds: see ``_ddpdoctor_recorder.py``; only the latest request waiting). Idle, the first
    looks at one file's status every ``interval`` seconds; the second sleeps on an event. Every
    ``progress_s`` seconds (0: never) once torch.distributed is imported, the first also writes the
    collectives' progress (``frprog-<pid>.json``: ``pg_status`` and the active entries, microseconds),
    which ``run`` reads so that a rank spinning in a CUDA synchronisation inside a collective does not
    count as busy."""
    import signal
    import threading
    import time

    request = os.path.join(run_dir, "fr-request")
    wanted = []
    ready = threading.Event()

    def seen():
        return _ddpdoctor_file_state(request)

    def watch():
        try:  # stack requests are for the main thread (see beat)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
        except (AttributeError, OSError, ValueError):
            pass
        last = seen()
        read_at = 0.0
        while True:
            time.sleep(interval)
            if progress_s > 0 and time.monotonic() - read_at >= progress_s and "torch.distributed" in sys.modules:
                read_at = time.monotonic()  # the collectives' progress for run's hang detector, out of band
                try:
                    mod = _ddpdoctor_recorder()
                    if mod is not None:
                        mod.progress(run_dir)
                except Exception:  # noqa: BLE001 - never break the job
                    pass
            now = seen()
            if now is None or now == last:
                continue
            last = now
            try:
                with open(request, encoding="utf-8") as f:
                    token = str(__import__("json").load(f).get("token", ""))[:64]
            except Exception:  # noqa: BLE001 - a request being replaced: the next look reads it
                last = None
                continue
            _ddpdoctor_dump_recorder(run_dir, "request", token, ("quick",))
            wanted[:] = [token]
            ready.set()

    def full():
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
        except (AttributeError, OSError, ValueError):
            pass
        while ready.wait():
            ready.clear()
            if wanted:
                _ddpdoctor_dump_recorder(run_dir, "request", wanted.pop(), ("full",))

    threads = [threading.Thread(target=watch, name="ddpdoctor-recorder", daemon=True),
               threading.Thread(target=full, name="ddpdoctor-recorder-stacks", daemon=True)]
    for thread in threads:
        thread.start()
    return threads


def _ddpdoctor_progress_period(beat):
    """Seconds between two readings of the collectives' progress: ``DDPDOCTOR_FR_PROGRESS_S`` (0 turns
    them off), else the beat's, but at most twice a second."""
    try:
        return max(0.0, float(os.environ["DDPDOCTOR_FR_PROGRESS_S"]))
    except (KeyError, ValueError):
        return max(0.5, beat)


def _ddpdoctor_stack_thread(run_dir, signum, main_id):
    """A daemon thread that answers ``ddpdoctor run``'s and ``ddpdoctor stacks``' stack requests: when
    ``stackreq-<pid>`` in the run directory changes (it holds a token), it appends every thread's stack
    and the line ``# ddpdoctor stacks end <token>`` to ``stackans-<pid>.txt``, in one write (a file of
    its own: run's hang detector subtracts this thread's I/O, and faulthandler's ``stacks-<pid>.txt``
    by its size, so no byte is subtracted twice). Read under the GIL, not by faulthandler from a signal
    handler: that walks other threads' frames while they run and can crash the process it reads (a busy
    DataLoader thread, this hook's own beat; CPython issue 116008). The signal stays as the fallback for
    a process whose GIL is held where no thread can take it (a C call stuck without releasing it): then
    no other thread runs Python, and the dump is safe. The thread and the format are ddpdoctor's
    ``system/threadstacks.py`` (``ddpdoctor check``'s workers use it too), copied beside this file as
    ``_ddpdoctor_threadstacks.py`` and loaded by its path; it looks at one file's status ten times a
    second. (thread, answers' path); raises when the module cannot be loaded (readers use the signal)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ddpdoctor_threadstacks.py")
    spec = importlib.util.spec_from_file_location("_ddpdoctor_threadstacks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    request = os.path.join(run_dir, f"stackreq-{os.getpid()}")
    answers = os.path.join(run_dir, f"stackans-{os.getpid()}.txt")
    return module.start_answering(request, answers, main_id, block=signum), answers


def _ddpdoctor_install(role):
    import atexit
    import faulthandler
    import signal
    import threading

    run_dir = os.environ["DDPDOCTOR_RUN_DIR"]
    pid = os.getpid()
    signame = os.environ.get("DDPDOCTOR_STACK_SIGNAL", "SIGUSR2")
    signum = getattr(signal, signame)
    stack_path = os.path.join(run_dir, f"stacks-{pid}.txt")
    fd = os.open(stack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                 0o600)
    stack_file = os.fdopen(fd, "a")
    # Ignored first, so that what faulthandler saves as the "previous" action, and restores whenever it
    # lets go (our atexit, or the interpreter's finalization), is "ignore", never the default "terminate":
    # there is no instant at which a stack request could kill this process.
    signal.signal(signum, signal.SIG_IGN)
    faulthandler.register(signum, file=stack_file, all_threads=True, chain=False)
    beat_path = os.path.join(run_dir, f"beat-{pid}")
    beat_fd = os.open(beat_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    interval = float(os.environ.get("DDPDOCTOR_BEAT_S", "1.0"))
    main_id = threading.main_thread().ident
    rank = os.environ.get("RANK") if role == "rank" else None
    redaction = _ddpdoctor_redaction()
    argv = list(getattr(sys, "argv", []) or [])
    info = {"pid": pid, "ppid": os.getppid(), "role": role, "rank": int(rank) if rank and rank.isdigit() else None,
            "local_rank": os.environ.get("LOCAL_RANK"), "argv": redaction.redact_argv(argv) if redaction else None,
            "signal": signame, "main_thread": main_id, "stack_file": stack_path, "beat_file": beat_path,
            "host": os.uname().nodename}
    stop = threading.Event()
    import collections

    timing = role in ("rank", "spawn") and os.environ.get("DDPDOCTOR_STRAGGLER", "1") != "0"
    marking = role in ("rank", "spawn") and os.environ.get("DDPDOCTOR_WATCH_SOLO_WAIT", "1") != "0"
    events = collections.deque(maxlen=None if timing else 0)  # without timings, only solo-wait's marks
    coll_path = os.path.join(run_dir, f"coll-{pid}.txt")
    patched = [False, False]  # the collectives wrapped, the step hook installed
    inflight = [None]  # the collective in progress (see _ddpdoctor_time_collectives)
    opened = [0]  # the number of the last one written as "open"

    if (timing or marking) and "torch.distributed.distributed_c10d" not in sys.modules:
        _ddpdoctor_on_import("torch.distributed.distributed_c10d",
                             lambda module: _ddpdoctor_time_collectives(events, inflight, module))

    def flush_timings():
        if not (timing or marking):
            return
        if not patched[0]:
            patched[0] = _ddpdoctor_time_collectives(events, inflight)
        if timing and not patched[1]:
            patched[1] = _ddpdoctor_time_steps(events)
        call = inflight[0] if timing else None
        if timing and (events or (call is not None and call[3] != opened[0])):
            lines = []
            while events:
                e = events.popleft()
                if e[0] == "step":
                    lines.append(f"step {e[1]:.6f} {e[2]}\n")
                else:
                    lines.append(f"{e[0]:.6f} {e[1]:.6f} {e[2]} {e[3]} {e[4]}\n")
            if call is not None and call[3] != opened[0] and inflight[0] is call:  # still running: a beat's worth in
                opened[0] = call[3]
                lines.append(f"open {call[0]:.6f} {call[1]} {call[2]} {call[3]}\n")
            fd = os.open(coll_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, "".join(lines).encode())
            finally:
                os.close(fd)

    watch_beat = None
    if role in ("rank", "spawn"):
        try:  # the watches for silent bugs (_ddpdoctor_watches, next to this file): nothing but a finder until torch
            import _ddpdoctor_watches

            watch_beat = _ddpdoctor_watches.start(run_dir, info)
        except Exception:  # noqa: BLE001 - never break the job
            watch_beat = None

    def beat():
        # Stack requests are for the main thread: blocked here, the kernel delivers them there, so the
        # dump never runs on this thread while the main thread's frames change (or the process exits).
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
        except (AttributeError, OSError, ValueError):
            pass
        last, count = None, 0
        while not stop.wait(interval):
            try:
                flush_timings()
                if watch_beat is not None:
                    watch_beat()
            except Exception:  # noqa: BLE001 - never break the job
                pass
            frame = sys._current_frames().get(main_id)
            if frame is None:
                return
            back = frame.f_back
            here = (id(frame.f_code), frame.f_lineno, id(back.f_code) if back else 0, back.f_lineno if back else 0)
            try:
                if role != "launcher" and _ddpdoctor_learn_rank(info, frame):
                    _ddpdoctor_write_json(f"proc-{pid}.json", info)
            except Exception:  # noqa: BLE001 - never break the job
                pass
            frame = back = None
            if here != last:
                last, count = here, count + 1
                try:
                    os.pwrite(beat_fd, b"%012d\n" % count, 0)
                except OSError:  # a full disk: the beat is lost, never the job (nor a traceback in its output)
                    pass

    thread = threading.Thread(target=beat, name="ddpdoctor-heartbeat", daemon=True)
    thread.start()
    # run's hang detector subtracts this thread's CPU time and I/O: ddpdoctor's work is not the job's
    info["own_threads"] = [getattr(thread, "native_id", None)]
    try:
        answering, info["stack_answers"] = _ddpdoctor_stack_thread(run_dir, signum, main_id)
        info["own_threads"].append(getattr(answering, "native_id", None))  # readers ask it first, the signal after
    except Exception:  # noqa: BLE001 - no thread: readers use the signal, as before
        pass
    if role in ("rank", "spawn"):  # the Flight Recorder's dumps on request: ddpdoctor's work too
        try:
            info["own_threads"] += [getattr(t, "native_id", None)
                                    for t in _ddpdoctor_recorder_thread(run_dir, signum, min(interval, 0.25),
                                                                        _ddpdoctor_progress_period(interval))]
        except Exception:  # noqa: BLE001 - no recorder thread: run names the rank as not answering
            pass

    def ended(how, **extra):
        if "exit" in _ddpdoctor_state or os.getpid() != pid:
            return
        _ddpdoctor_state["exit"] = True
        try:  # the timings since the last beat: a rank that raises keeps its last collectives on the timeline
            flush_timings()
        except Exception:  # noqa: BLE001
            pass
        try:
            import time

            _ddpdoctor_write_json(f"exit-{pid}.json", {"pid": pid, "how": how, "t": time.time(), **extra})
        except Exception:  # noqa: BLE001
            pass

    previous_hook = sys.excepthook

    def excepthook(kind, value, tb):
        try:
            # The frames, innermost first (the last 64): run names the user's line from them with the
            # rule every verdict uses (ddpdoctor.system.stackframes.user_place), which skips this file's
            # own wrappers (the collective timing) and ddpdoctor's package as well as the libraries.
            frames = [[f.filename, f.lineno, f.name] for f in __import__("traceback").extract_tb(tb)][::-1][:64]
            text = (f"{kind.__name__}: {value}".splitlines() or [kind.__name__])[0][:4000]
            text = redaction.shorten(text, 300) if redaction else text  # else run shortens it, redacting first
            ended("raised", exception=text, frames=frames)
        except Exception:  # noqa: BLE001
            pass
        if role in ("rank", "spawn") and os.getpid() == pid:  # not a forked DataLoader worker's copy
            _ddpdoctor_dump_recorder(run_dir, "raised", "", ("quick",))
        previous_hook(kind, value, tb)

    sys.excepthook = excepthook
    real_exit = sys.exit

    def exit(code=None):  # noqa: A001 - records sys.exit's code, then exits exactly as before
        if threading.current_thread() is threading.main_thread():
            _ddpdoctor_state["code"] = code if isinstance(code, int) or code is None else 1
        real_exit(code)

    sys.exit = exit
    real_os_exit = os._exit

    def os_exit(code):  # multiprocessing's fork children end here; so do jobs that skip interpreter exit
        if os.getpid() == pid:
            ended("exit", code=code, via="os._exit")
            if code and role in ("rank", "spawn"):
                _ddpdoctor_dump_recorder(run_dir, "exit", "", ("quick",))
        real_os_exit(code)

    os._exit = os_exit

    def finish():
        if os.getpid() != pid:
            return  # inherited by a forked child: that child has its own
        # First make a stack request harmless: the interpreter is about to restore SIGUSR2's default
        # action (terminate) when it finalizes faulthandler; ignored stays ignored.
        try:
            faulthandler.unregister(signum)  # restores "ignore" (see install) in one sigaction
        except (ValueError, OSError, RuntimeError):
            pass
        stop.set()
        thread.join(timeout=2)
        code = _ddpdoctor_state.get("code")
        ended("exit", code=code if code is not None else 0)
        if code and role in ("rank", "spawn"):
            _ddpdoctor_dump_recorder(run_dir, "exit", "", ("quick",))

    atexit.register(finish)
    _ddpdoctor_write_json(f"proc-{pid}.json", info)
    sys.modules["_ddpdoctor_injected"] = sys.modules[__name__]
    globals()["_ddpdoctor_keep"] = (stack_file, beat_fd)


def _ddpdoctor_after_fork():
    """A child forked (without exec) from the launched command is a rank candidate, like a spawned one."""
    try:
        if os.environ.get("DDPDOCTOR_RANK_MARK"):
            return
        os.environ["DDPDOCTOR_RANK_MARK"] = f"spawn:{os.getpid()}"
        _ddpdoctor_state.clear()
        _ddpdoctor_install("spawn")
    except Exception:  # noqa: BLE001
        pass


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
        _ddpdoctor_r = _ddpdoctor_role()
        if _ddpdoctor_r:
            _ddpdoctor_install(_ddpdoctor_r)
            if _ddpdoctor_r == "top":
                os.register_at_fork(after_in_child=_ddpdoctor_after_fork)
    except Exception as exc:  # noqa: BLE001 - never break the user's job
        sys.stderr.write(f"ddpdoctor: stack handler not installed: {exc}\n")
_ddpdoctor_chain()
