"""The watches of ``ddpdoctor run`` inside a rank: silent bugs found in the user's unchanged job (issue 24).

Copied into the run's ``.inject`` folder next to ``sitecustomize.py`` (which imports it in every rank;
the ``_ddpdoctor_`` prefix keeps it from shadowing a user's module). Importing it costs nothing: it
needs only the standard library until torch has finished importing, and then patches a few of torch's
classes once (a finder on ``sys.meta_path`` sees the end of ``import torch``; the heartbeat thread
tries again every beat, for a job that imported torch before this hook could see it).

What each rank records, as files in the run directory (``ddpdoctor run`` reads them, compares the
ranks and reports; nothing here talks to another rank, and nothing here is a collective):

* ``sampler-epoch``: every pass over a ``DataLoader`` whose sampler (or batch sampler) has
  ``set_epoch`` and shuffles is a *pass*; a pass during which an optimizer stepped is a *training
  pass*. At the first optimizer step of a training pass, the pass's order is compared with the
  sampler's previous training pass: the sampler's ``epoch`` and ``seed`` where it has them, else the
  first indices the loader drew. The same order is a finding, written once per sampler
  (``finding-<pid>-<n>.json``): set_epoch never called, or called with a constant, with the loop's
  line and the ``set_epoch`` line. A pass with no optimizer step (evaluation on the training set)
  is never compared, and ``shuffle=False`` is never watched.
* ``data-plan``: at the start of every pass over a DataLoader, what the pass will read: ``len(loader)``
  (the batches), the dataset's length, the sampler's ``num_replicas``, ``seed`` and ``drop_last``, the
  loader's ``drop_last``; written (``plan-<pid>-<n>.json``) when it changed for that loop line, so
  usually once per loop: ``run`` compares the ranks' plans and names a difference before the epoch's
  end hangs on it. A loader without ``len()`` (an IterableDataset) has its batches counted as each pass
  reads them (``count-<pid>.json``, see :class:`_PassCounts`): ``run`` names ranks whose same pass read
  different numbers, as soon as one rank's pass ended and another's read past it.
* ``desync``: optimizer steps are counted (a global step pre-hook: one Python call per step). At the
  first step, and at the start of every step whose count is a multiple of the period ``run`` wrote
  (``desync-period``: the optimizer steps of one window, read by the heartbeat thread when the file
  changed; the same multiples on every rank, with no round trip per window), the parameters of every optimizer that stepped and of every DDP
  model are fingerprinted with the library's fingerprint (``_ddpdoctor_fingerprint``, a copy of
  :mod:`ddpdoctor.diagnostics.fingerprint`) and written as ``desync-<pid>-<kind>-<step>.json`` with
  what the hook saw (each tensor with its name, taken at its optimizer's first step, and its place,
  ``optimizer <k> parameter <i>`` or ``ddp <j> <name>``: the same on every rank, whatever the name):
  which tensors DDP synchronizes (the parameters it had when built), which were attached to a DDP
  model after it was built, ``init_sync``, the user's line. Once more at the end
  (``destroy_process_group``, the first optimizer freed, or the interpreter's exit).
  ``desync-steps-<pid>`` holds the step count, rewritten by the heartbeat thread when it changed.

* ``solo-wait``: the ``timeout=`` passed to ``init_process_group`` (else the backend's default: NCCL 10
  minutes, others 30) is noted when it returns. Every beat, the heartbeat thread looks at the collective
  the main thread is in (the hook's collective wrappers and DDP's forward and backward mark it:
  ``_ddpdoctor_waiting`` in ``sitecustomize``), counted from when it began or the main thread's frames
  last moved, whichever is later (a mark a failed backward left behind ends when the frames move). A
  wait past a quarter of the timeout is written (``solo-<pid>.json``, state ``waiting``: ``run`` then
  asks every rank where it is), past half again (state ``long``: ``run`` names it with where the ranks
  not waiting are); the file goes when the wait ends. ``run``'s question is ``solo-ask`` (a token); the
  answer ``solo-where-<pid>.json``: the main thread's user frame and whether it waits.

Nothing here counts as progress for the hang detector: the heartbeat thread only writes when the
job's own step count moved and only reads the period after ``run`` wrote a new one, which ``run``
does only while steps move. Every entry point catches everything: a watch must never break the job.
"""

import os
import sys

NAMES = ("sampler-epoch", "data-plan", "desync", "bn-drift", "solo-wait")
_LIBRARY = ("/torch/", "/site-packages/", "/dist-packages/", "/lib/python3", "/.inject/", "<frozen", "<string>",
            "/ddpdoctor/postmortem/inject/")

_state = None


def enabled(name, env=None):
    """Whether the watch ``name`` is on (``DDPDOCTOR_WATCH_<NAME>=0`` turns it off)."""
    env = os.environ if env is None else env
    return env.get("DDPDOCTOR_WATCH_" + name.upper().replace("-", "_"), "1") != "0"


def _where(frame):
    """``func (file:line)`` of the innermost frame at or above ``frame`` that is the user's code."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not any(part in name for part in _LIBRARY):
            return f"{frame.f_code.co_name} ({name}:{frame.f_lineno})"
        frame = frame.f_back
    return ""


def _replace(c10d, package, name, real, wrapper):
    """Put ``wrapper`` (marked as the watches', wrapping ``real``) in c10d as ``name``, and in
    ``torch.distributed`` where that exposes the same function (``dist.init_process_group``)."""
    wrapper._ddpdoctor_watch = True
    wrapper.__wrapped__ = real
    wrapper.__doc__ = real.__doc__
    setattr(c10d, name, wrapper)
    if getattr(package, name, None) is real:
        setattr(package, name, wrapper)


def _write_json(run_dir, name, data):
    import json

    tmp = os.path.join(run_dir, f".{name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(run_dir, name))


class _SamplerLog:
    """What the watch knows of one sampler: its set_epoch calls and its last training pass."""

    __slots__ = ("calls", "value", "set_where", "last", "reported")

    def __init__(self):
        self.calls = 0
        self.value = None
        self.set_where = ""
        self.last = None  # (order key, loop line) of the last training pass
        self.reported = False


class _Pass:
    """One iteration over a DataLoader whose sampler reshuffles with set_epoch."""

    __slots__ = ("log", "sampler", "key", "first", "where", "iterator", "kind")

    def __init__(self, log, sampler, key, where, iterator, kind):
        self.log, self.sampler, self.key, self.where, self.iterator, self.kind = log, sampler, key, where, iterator, kind
        self.first = None


def _recorded(indices, p):
    """The loader's index iterator, unchanged, noting the first batch of indices it yields."""
    try:
        first = next(indices)
    except StopIteration:
        return
    try:
        p.first = tuple(int(i) for i in first[:16]) if isinstance(first, (list, tuple)) else (int(first),)
    except Exception:  # noqa: BLE001 - indices of an unusual kind: compared as they are
        p.first = (repr(first)[:200],)
    yield first
    yield from indices


class _Rank:
    """The watches of this process."""

    def __init__(self, run_dir, info):
        import threading

        self.run_dir = run_dir
        self.info = info
        self.pid = os.getpid()
        self.sampler_on = enabled("sampler-epoch")
        self.plan_on = enabled("data-plan")
        self.plans = {}  # loop line -> the last data plan written for it
        self.desync_on = enabled("desync")
        self.installed = False
        self.lock = threading.Lock()
        self.steps = 0
        self.period = 0  # desync: fingerprint at the start of every step whose count is a multiple of it
        self.period_seen = None
        self.steps_written = -1
        self.findings = 0
        self.open_passes = []
        self.optimizers = []  # weak references, in the order first seen
        self.seen_optimizers = set()  # id() of every optimizer that stepped
        self.names = {}  # optimizer's index in self.optimizers -> names of its parameters
        self.ddps = []  # weak references to the DDP models built
        self.final_done = False
        self.solo = _SoloWait(run_dir, self._rank) if enabled("solo-wait") else None
        self.counts = None  # data-plan: the batches of passes over loaders without len(), counted
        self.bn = _BnDrift(self) if enabled("bn-drift") else None

    # --- installation --------------------------------------------------------------------------

    def install(self, torch_done=False):
        """Patch torch once it is loaded; True when done. ``torch_done``: called right after torch's own
        module ran (its import is still marked as initializing then, its submodules are not)."""
        if self.installed:
            return True
        mods = sys.modules
        need = ("torch", "torch.optim.optimizer", "torch.utils.data.dataloader", "torch.nn.parallel.distributed",
                "torch.utils.data.distributed", "torch.nn.modules.batchnorm")
        for name in need:
            mod = mods.get(name)
            if mod is None or (getattr(getattr(mod, "__spec__", None), "_initializing", False)
                               and not (torch_done and name == "torch")):
                return False
        with self.lock:
            if self.installed:
                return True
            self.installed = True
            import atexit

            self._patch_loader()
            self._patch_ddp()
            if self.solo is not None and mods.get("torch.distributed.distributed_c10d") is not None:
                self.solo.patch(mods["torch.distributed.distributed_c10d"], mods.get("torch.distributed"))
            if self.bn is not None:
                self.bn.install()
            mods["torch.optim.optimizer"].register_optimizer_step_pre_hook(self.pre_step)
            atexit.register(self.final, "the interpreter's exit")
        return True

    def _patch_loader(self):
        dataloader = sys.modules["torch.utils.data.dataloader"].DataLoader
        sampler_cls = sys.modules["torch.utils.data.distributed"].DistributedSampler
        if self.sampler_on:
            self._wrap_set_epoch(sampler_cls)
        if self.sampler_on or self.plan_on:
            real_iter = dataloader.__iter__
            if not getattr(real_iter, "_ddpdoctor_watch", False):
                state = self

                def __iter__(loader):
                    it = real_iter(loader)
                    try:
                        state.pass_started(loader, it, sys._getframe(1))
                    except Exception:  # noqa: BLE001 - never break the job
                        pass
                    return it

                __iter__._ddpdoctor_watch = True
                __iter__.__wrapped__ = real_iter
                dataloader.__iter__ = __iter__

    def _wrap_set_epoch(self, cls):
        real = cls.__dict__.get("set_epoch")
        if real is None:
            for base in cls.__mro__:
                real = base.__dict__.get("set_epoch")
                if real is not None:
                    break
        if real is None or getattr(real, "_ddpdoctor_watch", False) or not callable(real):
            return
        state = self

        def set_epoch(sampler, epoch, *args, **kwargs):
            try:
                log = sampler.__dict__.get("_ddpdoctor_log")
                if log is None:
                    log = sampler.__dict__["_ddpdoctor_log"] = _SamplerLog()
                log.calls += 1
                log.value = epoch if isinstance(epoch, (int, float, str)) else repr(epoch)[:50]
                log.set_where = _where(sys._getframe(1))
            except Exception:  # noqa: BLE001
                pass
            return real(sampler, epoch, *args, **kwargs)

        set_epoch._ddpdoctor_watch = True
        set_epoch.__wrapped__ = real
        set_epoch.__doc__ = getattr(real, "__doc__", None)
        try:
            setattr(cls, "set_epoch", set_epoch)
        except (TypeError, AttributeError):
            pass
        del state

    def _patch_ddp(self):
        ddp = sys.modules["torch.nn.parallel.distributed"].DistributedDataParallel
        real_init = ddp.__init__
        if getattr(real_init, "_ddpdoctor_watch", False):
            return
        state = self

        def __init__(model, module, *args, **kwargs):
            real_init(model, module, *args, **kwargs)
            try:
                state.ddp_built(model, module, args, kwargs, sys._getframe(1))
            except Exception:  # noqa: BLE001
                pass

        __init__._ddpdoctor_watch = True
        __init__.__wrapped__ = real_init
        ddp.__init__ = __init__
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        package = sys.modules.get("torch.distributed")
        real_destroy = getattr(c10d, "destroy_process_group", None)
        if real_destroy is not None and not getattr(real_destroy, "_ddpdoctor_watch", False):
            def destroy_process_group(*args, **kwargs):
                state.final("destroy_process_group")
                return real_destroy(*args, **kwargs)

            _replace(c10d, package, "destroy_process_group", real_destroy, destroy_process_group)

    # --- what the patches call -----------------------------------------------------------------

    def ddp_built(self, model, module, args, kwargs, frame):
        import weakref

        init_sync = kwargs.get("init_sync", args[4] if len(args) > 4 else True)
        model.__dict__["_ddpdoctor_built"] = {
            "params": frozenset(id(p) for p in module.parameters()), "init_sync": bool(init_sync),
            "where": _where(frame)}
        self.ddps.append(weakref.ref(model))

    def pass_started(self, loader, it, frame):
        """A DataLoader iteration starts: remember its order if its sampler reshuffles with set_epoch."""
        if os.getpid() != self.pid:
            return
        where = _where(frame)
        if self.plan_on:
            self._plan(loader, where, it)
        if not self.sampler_on:
            return
        sampler = None
        for candidate in (getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None),
                          getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
            if candidate is not None and callable(getattr(candidate, "set_epoch", None)):
                sampler = candidate
                break
        if sampler is None or getattr(sampler, "shuffle", True) is False:
            return
        self._wrap_set_epoch(type(sampler))
        log = sampler.__dict__.get("_ddpdoctor_log")
        if log is None:
            log = sampler.__dict__["_ddpdoctor_log"] = _SamplerLog()
        if log.reported:
            return
        import weakref

        if hasattr(sampler, "epoch") and hasattr(sampler, "shuffle"):
            key = ("epoch", repr(sampler.epoch)[:50], repr(getattr(sampler, "seed", None))[:50])
            kind = "epoch"
        else:
            key, kind = None, "indices"
        p = _Pass(log, type(sampler).__name__, key, where, weakref.ref(it), kind)
        if key is None:
            inner = getattr(it, "_sampler_iter", None)
            if inner is None:
                return
            it._sampler_iter = _recorded(inner, p)
        # a loader with persistent workers hands out the same iterator every pass: a new pass ends the last
        self.open_passes = [q for q in self.open_passes if q.iterator() is not None and q.iterator() is not it] + [p]

    def _plan(self, loader, where, it=None):
        """data-plan: what this pass will read (batches, the sampler's shard), written when it changed."""
        plan = {}
        for name, get in (("batches", lambda: len(loader)), ("dataset length", lambda: len(loader.dataset))):
            try:
                plan[name] = int(get())
            except Exception:  # noqa: BLE001 - an IterableDataset, a sampler without __len__
                pass
        if "batches" not in plan and it is not None:  # no len(): the batches are counted as the pass reads them
            if self.counts is None:
                self.counts = _PassCounts(self.run_dir, self._rank, lambda: self.steps)
            self.counts.start(it, where)
        sampler = getattr(loader, "sampler", None)
        for attr, name in (("num_replicas", "num_replicas"), ("seed", "seed"), ("drop_last", "sampler drop_last")):
            value = getattr(sampler, attr, None)
            if isinstance(value, (int, bool)):
                plan[name] = value
        if isinstance(getattr(loader, "drop_last", None), bool):
            plan["loader drop_last"] = loader.drop_last
        if self.plans.get(where) == plan:
            return
        self.plans[where] = plan
        self.findings += 1
        _write_json(self.run_dir, f"plan-{self.pid}-{self.findings}.json", {
            "pid": self.pid, "rank": self._rank(), "where": where, "plan": plan, "n": self.findings})

    def pre_step(self, optimizer, args, kwargs):
        """The global optimizer step pre-hook: one call per step, kept short."""
        self.steps += 1
        try:
            if self.open_passes:
                self._passes_trained()
            if self.desync_on and (self.steps == 1 or (self.period and self.steps % self.period == 0)
                                   or id(optimizer) not in self.seen_optimizers):
                self._desync_step(optimizer)
        except Exception:  # noqa: BLE001 - never break the job
            pass

    def _passes_trained(self):
        passes, self.open_passes = self.open_passes, []
        for p in passes:
            if p.iterator() is None:
                continue  # ended with no optimizer step: an evaluation pass, never compared
            self._compare_pass(p)

    def _compare_pass(self, p):
        log = p.log
        key = p.key if p.key is not None else (("first",) + p.first if p.first is not None else None)
        if key is None:
            return
        previous, log.last = log.last, (key, p.where)
        if previous is None or previous[0] != key or log.reported:
            return
        log.reported = True
        loop = p.where or previous[1]
        name = p.sampler
        if p.kind == "epoch" and log.calls == 0:
            what = (f"the {name}'s shuffled order repeats every epoch: set_epoch is never called, so each "
                    f"training pass over the loader (the loop at {loop}) reads the same order")
            fix = "call sampler.set_epoch(epoch) at the start of every epoch, before the loop over the loader"
            key_name = "never-called"
        elif p.kind == "epoch":
            what = (f"the {name}'s shuffled order repeats every epoch: set_epoch is called with the same value "
                    f"({log.value}) every epoch (at {log.set_where}), so each training pass over the loader (the "
                    f"loop at {loop}) reads the same order")
            fix = "pass the epoch number that changes every epoch: sampler.set_epoch(epoch)"
            key_name = "constant"
        else:
            what = (f"the {name}'s first indices repeat from one training pass to the next (the loop at {loop}): "
                    f"its order does not change between epochs" + (
                        f" (set_epoch called with {log.value} at {log.set_where})" if log.calls else
                        " (set_epoch is never called)"))
            fix = "call sampler.set_epoch(epoch) with the epoch number at the start of every epoch"
            key_name = "indices"
        self.report("sampler-epoch", f"{key_name}:{loop}", what, fix, where=loop)

    def report(self, watch, key, what, fix, where=""):
        """Write one finding of this rank for ``run`` to read (and to name once, with the other ranks')."""
        self.findings += 1
        _write_json(self.run_dir, f"finding-{self.pid}-{self.findings}.json", {
            "pid": self.pid, "rank": self._rank(), "watch": watch, "key": key, "what": what, "fix": fix,
            "where": where, "step": self.steps})

    def _rank(self):
        td = sys.modules.get("torch.distributed")
        try:
            if td is not None and td.is_available() and td.is_initialized():
                return int(td.get_rank())
        except Exception:  # noqa: BLE001
            pass
        return self.info.get("rank")

    # --- desync ----------------------------------------------------------------------------------

    def _desync_step(self, optimizer):
        import weakref

        if id(optimizer) not in self.seen_optimizers:
            self.seen_optimizers.add(id(optimizer))
            self.optimizers.append(weakref.ref(optimizer))
            params = [p for g in optimizer.param_groups for p in g["params"]]
            weakref.finalize(optimizer, self._final_of, len(self.optimizers) - 1, params)
            # named now, at its first step: the same point of the program on every rank. Named at the
            # first fingerprint that held it instead, a rank that took a window the others had not yet
            # (each reads the period on its own beat) named it from another frame, or not at all.
            names = self._param_names(sys._getframe(2))
            self.names[len(self.optimizers) - 1] = self._known(len(self.optimizers) - 1, params, names)
        if self.steps == 1:
            self.fingerprint("start", sys._getframe(2))
        elif self.period and self.steps % self.period == 0:
            self.fingerprint("window", sys._getframe(2))

    def _final_of(self, index, params):
        self.final("the optimizer freed", extra=(index, params))

    def final(self, why, extra=None):
        """The last fingerprint of this rank (once): at destroy_process_group, the first optimizer
        freed, or the exit (bn-drift's too)."""
        if self.bn is not None:
            try:
                self.bn.final()
            except Exception:  # noqa: BLE001 - never break the job (nor its exit)
                pass
        if self.final_done or not self.desync_on or self.steps == 0 or os.getpid() != self.pid:
            return
        self.final_done = True
        try:
            self.fingerprint("final", None, extra=extra, why=why)
        except Exception:  # noqa: BLE001 - never break the job (nor its exit)
            pass

    def _param_names(self, frame):
        """``id(param) -> name`` from the modules in the user's frames (``model.module.fc.weight``)."""
        module_cls = sys.modules["torch.nn.modules.module"].Module
        names = {}

        def add(prefix, module):
            for n, p in module.named_parameters():
                names.setdefault(id(p), f"{prefix}.{n}")

        depth = 0
        while frame is not None and depth < 40:
            depth += 1
            if not any(part in frame.f_code.co_filename for part in _LIBRARY):
                for var, value in list(frame.f_locals.items()):
                    if isinstance(value, module_cls):
                        add(var, value)
                    elif var == "self" and hasattr(value, "__dict__"):
                        for attr, v in list(vars(value).items()):
                            if isinstance(v, module_cls):
                                add(f"self.{attr}", v)
            frame = frame.f_back
        return names

    @staticmethod
    def _known(k, params, names):
        """The names of optimizer ``k``'s parameters: the user's (``names``), else by position."""
        return [names.get(id(p)) or f"optimizer {k} parameter {i} {tuple(p.shape)}" for i, p in enumerate(params)]

    def fingerprint(self, kind, frame, extra=None, why=""):
        """Fingerprint the optimizers' and DDP models' parameters; write the record for ``run``."""
        fpm = __import__("_ddpdoctor_fingerprint")
        import torch

        ddps = [m for m in (r() for r in self.ddps) if m is not None]
        synced, attached, module_now = set(), set(), {}
        for m in ddps:
            built = m.__dict__.get("_ddpdoctor_built", {})
            synced |= built.get("params", frozenset())
            for n, p in m.module.named_parameters():
                module_now.setdefault(id(p), p)
        attached = {i for i in module_now if i not in synced}
        names = self._param_names(frame) if frame is not None else {}
        tensors = []  # (name, tensor)
        seen = set()
        for k, ref in enumerate(self.optimizers):
            opt = ref()
            if extra is not None and extra[0] == k:
                params = extra[1]
            elif opt is not None:
                params = [p for g in opt.param_groups for p in g["params"]]
            else:
                continue
            known = self.names.get(k)
            if known is None or len(known) != len(params):
                known = self.names[k] = self._known(k, params, names)
            for i, (name, p) in enumerate(zip(known, params)):
                if id(p) not in seen:
                    seen.add(id(p))
                    tensors.append((name, p, id(p), f"optimizer {k} parameter {i}"))
        for j, m in enumerate(ddps):
            for n, p in m.named_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    tensors.append((names.get(id(p)) or f"ddp {j} {n}", p, id(p), f"ddp {j} {n}"))
        by_device = {}
        for i, (_, p, _, _) in enumerate(tensors):
            by_device.setdefault(p.device, []).append(i)
        values = [0] * len(tensors)
        with torch.no_grad():
            for idx in by_device.values():
                fps = fpm.fingerprint_many([tensors[i][1] for i in idx]).tolist()
                for i, v in zip(idx, fps):
                    values[i] = v
        record = {
            "pid": self.pid, "rank": self._rank(), "kind": kind, "step": self.steps, "why": why,
            "where": _where(frame) if frame is not None else "",
            "ddp": [m.__dict__.get("_ddpdoctor_built", {}).get("where", "") for m in ddps],
            "init_sync_off": [m.__dict__.get("_ddpdoctor_built", {}).get("where", "") for m in ddps
                              if not m.__dict__.get("_ddpdoctor_built", {}).get("init_sync", True)],
            "tensors": [[name, values[i], "ddp" if pid_ in synced else ("attached" if pid_ in attached else ""), key]
                        for i, (name, _, pid_, key) in enumerate(tensors)],
        }
        _write_json(self.run_dir, f"desync-{self.pid}-{kind}-{self.steps}.json", record)

    # --- the heartbeat thread --------------------------------------------------------------------

    def beat(self):
        """Called by the heartbeat thread every beat: install late, publish the step count, read the period."""
        if not self.installed and not self.install():
            return
        if self.solo is not None:
            self.solo.beat(self.info.get("main_thread"))
        if self.counts is not None:
            self.counts.write()
        if not self.desync_on:
            return
        steps = self.steps
        if steps != self.steps_written:
            self.steps_written = steps
            path = os.path.join(self.run_dir, f"desync-steps-{self.pid}")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                os.pwrite(fd, b"%012d\n" % steps, 0)
            finally:
                os.close(fd)
        try:
            st = os.stat(os.path.join(self.run_dir, "desync-period"))
        except OSError:
            return
        seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        if seen != self.period_seen:
            self.period_seen = seen
            try:
                with open(os.path.join(self.run_dir, "desync-period"), "rb") as f:
                    self.period = max(0, int(f.read(32).split()[0]))
            except (OSError, ValueError, IndexError):
                pass


class _PassCounts:
    """data-plan for loaders without ``len()`` (an IterableDataset): each pass's batches, counted as read.

    The n-th pass over a loop line is the same pass on every rank. ``count-<pid>.json`` holds the last
    two passes of each loop (batches read so far, ended or not, an optimizer stepped during it or not:
    only a training pass is compared, an evaluation may read uneven shards): rewritten by the main thread when a pass
    ends and by the heartbeat when a count moved (a rank blocked in its extra batch's collective still
    publishes it). The count is one attribute read and an increment per batch, in a wrapper of the loader
    iterator's ``__next__`` made when the first such loader is seen."""

    def __init__(self, run_dir, rank, steps):
        self.run_dir = run_dir
        self.rank = rank
        self.steps = steps  # the optimizer steps so far: a pass during which one stepped is a training pass
        self.pid = os.getpid()
        self.passes = {}  # loop line -> [pass number, ...records]
        self.records = []  # [where, n, batches, ended]: the last two of each loop
        self.written = None
        self.lock = __import__("threading").Lock()  # the main thread (a pass ended) and the heartbeat write
        self._patch()

    @staticmethod
    def _patch():
        cls = sys.modules["torch.utils.data.dataloader"]._BaseDataLoaderIter
        real = cls.__dict__.get("__next__")
        if real is None or getattr(real, "_ddpdoctor_watch", False):
            return

        def __next__(it):
            record = it.__dict__.get("_ddpdoctor_count")
            if record is None:
                return real(it)
            try:
                batch = real(it)
            except StopIteration:
                if not record[3]:
                    record[3] = True
                    record[5] = record[4].steps() - record[5]  # ended: the steps it saw, frozen
                    try:
                        record[4].write()
                    except Exception:  # noqa: BLE001 - never break the job
                        pass
                raise
            record[2] += 1
            return batch

        __next__._ddpdoctor_watch = True
        __next__.__wrapped__ = real
        cls.__next__ = __next__

    def start(self, it, where):
        n = self.passes.get(where, -1) + 1
        self.passes[where] = n
        record = [where, n, 0, False, self, self.steps()]  # ..., the steps at its start (at its end: its own)
        it.__dict__["_ddpdoctor_count"] = record
        same = [r for r in self.records if r[0] == where]
        if len(same) >= 2:
            self.records.remove(same[0])
        self.records.append(record)

    def write(self):
        with self.lock:
            steps = self.steps()
            rows = [r[:4] + [(r[5] if r[3] else steps - r[5]) > 0] for r in list(self.records)]
            if rows == self.written:
                return
            self.written = rows
            _write_json(self.run_dir, f"count-{self.pid}.json", {"pid": self.pid, "rank": self.rank(),
                                                                 "passes": rows})


class _SoloWait:
    """solo-wait: a wait in one collective past a quarter, then half, of the process group's timeout."""

    def __init__(self, run_dir, rank):
        self.run_dir = run_dir
        self.rank = rank  # the rank number, as the other watches learn it
        self.pid = os.getpid()
        self.timeout = None  # seconds, once init_process_group returned
        self.timeout_from = ""
        self.slot = None  # sitecustomize's [(start, what)]: the collective the main thread is in
        self.here = None
        self.moved_at = 0.0  # (monotonic) the main thread's frames last moved, at or before
        self.last_beat = 0.0
        self.key = None  # the wait being followed: its start
        self.state = ""  # "" / "waiting" / "long": what solo-<pid>.json says of it
        self.ask_seen = None

    def patch(self, c10d, package):
        """Note the ``timeout=`` that ``init_process_group`` is given (and the user's line)."""
        real = getattr(c10d, "init_process_group", None)
        if real is None or getattr(real, "_ddpdoctor_watch", False):
            return
        state = self

        def init_process_group(*args, **kwargs):
            result = real(*args, **kwargs)
            try:
                state.initialized(c10d, args[2] if len(args) > 2 else kwargs.get("timeout"), sys._getframe(1))
            except Exception:  # noqa: BLE001 - never break the job
                pass
            return result

        _replace(c10d, package, "init_process_group", real, init_process_group)

    def initialized(self, c10d, timeout, frame):
        where = _where(frame)
        if timeout is not None and hasattr(timeout, "total_seconds"):
            self.timeout = float(timeout.total_seconds())
            self.timeout_from = f"timeout= passed to init_process_group at {where}" if where else \
                "timeout= passed to init_process_group"
            return
        backend = str(c10d.get_backend())
        self.timeout = float(c10d._get_default_timeout(backend).total_seconds())
        self.timeout_from = f"{backend}'s default" + (f", init_process_group at {where}" if where else "")

    def beat(self, main_id):
        """Follow the main thread's wait; answer run's question. Called by the heartbeat thread."""
        import time

        now = time.monotonic()
        frame = sys._current_frames().get(main_id)
        if frame is None:
            return
        back = frame.f_back
        here = (id(frame.f_code), frame.f_lineno, id(back.f_code) if back else 0, back.f_lineno if back else 0)
        if here != self.here:
            self.here, self.moved_at = here, self.last_beat  # it moved since the last look
        self.last_beat = now
        if self.slot is None:
            injected = sys.modules.get("_ddpdoctor_injected")
            self.slot = getattr(injected, "_ddpdoctor_waiting", None)
        mark = self.slot[0] if self.slot is not None else None
        waited = 0.0
        if mark is not None and self.timeout:
            since = max(mark[0], self.moved_at)
            waited = now - since
            if since != self.key:
                self._ended()
                self.key = since
            for state, part in (("long", 0.5), ("waiting", 0.25)):
                if waited >= self.timeout * part:
                    if self.state != state and not (state == "waiting" and self.state == "long"):
                        self.state = state
                        _write_json(self.run_dir, f"solo-{self.pid}.json", {
                            "pid": self.pid, "rank": self.rank(), "state": state, "what": mark[1],
                            "since": time.time() - waited, "waited": waited, "timeout": self.timeout,
                            "timeout_from": self.timeout_from, "where": _where(frame)})
                    break
        else:
            self._ended()
        self._answer(frame, mark is not None and waited > 0, mark)

    def _ended(self):
        if self.state:
            self.state = ""
            try:
                os.unlink(os.path.join(self.run_dir, f"solo-{self.pid}.json"))
            except OSError:
                pass
        self.key = None

    def _answer(self, frame, waiting, mark):
        """run asked where every rank is (``solo-ask`` changed): this rank's user frame."""
        try:
            st = os.stat(os.path.join(self.run_dir, "solo-ask"))
        except OSError:
            return
        seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        if seen == self.ask_seen:
            return
        self.ask_seen = seen
        try:
            with open(os.path.join(self.run_dir, "solo-ask"), "rb") as f:
                token = f.read(64).decode("ascii", "replace").strip()
        except OSError:
            return
        _write_json(self.run_dir, f"solo-where-{self.pid}.json", {
            "pid": self.pid, "rank": self.rank(), "token": token, "where": _where(frame), "waiting": bool(waiting),
            "what": mark[1] if mark is not None else ""})
class _BnLayer:
    """What bn-drift knows of one BatchNorm layer that ran a training forward."""

    __slots__ = ("ref", "index", "owner", "drifts", "where", "name")

    def __init__(self, ref, index, owner, drifts, where):
        self.ref, self.index, self.owner, self.drifts, self.where = ref, index, owner, drifts, where
        self.name = ""


def _call_site(frame):
    """The user's line that called the outermost module running at ``frame`` (``model(x)``, not the
    model's own ``forward``); the innermost user frame when no module call is found."""
    site = None
    f = frame
    while f is not None:
        code = f.f_code
        if code.co_name in ("_call_impl", "_wrapped_call_impl") and code.co_filename.endswith(
                os.path.join("nn", "modules", "module.py")):
            site = f.f_back
        f = f.f_back
    return _where(site if site is not None else frame)


class _BnDrift:
    """``bn-drift`` in a rank: BatchNorm running statistics where the ranks' drift survives.

    DDP broadcasts rank 0's buffers at the start of every forward through the DDP model (its buffer
    sync on), so the ranks' statistics then differ by one update at most and are equal again at the next
    forward through the wrapper: never recorded. Statistics matter where they are used, at evaluation
    and in checkpoints, so that is where they are recorded, as ``bn-<pid>-<kind>-<step>-<owner>.json``
    (each layer's ``running_mean``, ``running_var``, ``eps``, why it can drift and the user's line):

    * ``eval``: at the first evaluation forward, after each optimizer step count, of a layer outside a
      buffer-broadcasting DDP forward (evaluation through ``model.module``, of a model never wrapped, or
      of one whose buffer sync is off): the statistics that evaluation uses, of every trained layer of
      the same model, with the evaluation's line (the same step count on every rank names the moment);
    * ``final``: at the end (``destroy_process_group``, the first optimizer freed, the exit), what a
      checkpoint would save of the layers trained outside a forward that broadcasts buffers: a DDP
      model with ``broadcast_buffers=False`` (``forward_sync_buffers`` off), no DDP at all, or a
      training forward through ``model.module``.

    Statistics made equal before evaluation and at the end (``ddpdoctor.sync_bn_stats``) are silent.

    Costs one Python call per BatchNorm forward and one per DDP forward; the statistics are read only
    at those moments.
    """

    def __init__(self, rank):
        self.rank = rank
        self.covered = 0  # depth of forwards through a DDP model that broadcasts its buffers first
        self.info = {}  # id(layer) -> _BnLayer
        self.order = []  # the _BnLayer records in the order first trained
        self.eval_steps = {}  # owner (a DDP model's index, -1: none) -> the step count of its last eval snapshot
        self.final_done = False

    def install(self):
        bn_cls = sys.modules["torch.nn.modules.batchnorm"]._BatchNorm
        ddp_cls = sys.modules["torch.nn.parallel.distributed"].DistributedDataParallel
        real_bn, real_ddp = bn_cls.forward, ddp_cls.forward
        drift = self
        # under torch.compile's tracing this is constant True: the traced graph holds none of the watch
        compiling = getattr(getattr(sys.modules["torch"], "compiler", None), "is_compiling", None) or (lambda: False)
        if not getattr(real_bn, "_ddpdoctor_watch", False):
            def forward(bn, *args, **kwargs):
                try:
                    if compiling():
                        pass
                    elif drift.covered:
                        if id(bn) not in drift.info:
                            drift.trained(bn, False)
                    else:
                        drift.uncovered(bn)
                except Exception:  # noqa: BLE001 - never break the job
                    pass
                return real_bn(bn, *args, **kwargs)

            forward._ddpdoctor_watch = True
            forward.__wrapped__ = real_bn
            bn_cls.forward = forward
        if not getattr(real_ddp, "_ddpdoctor_watch", False):
            def ddp_forward(model, *args, **kwargs):
                if not _syncs_buffers(model):
                    return real_ddp(model, *args, **kwargs)
                drift.covered += 1
                try:
                    return real_ddp(model, *args, **kwargs)
                finally:
                    drift.covered -= 1

            ddp_forward._ddpdoctor_watch = True
            ddp_forward.__wrapped__ = real_ddp
            ddp_cls.forward = ddp_forward

    # --- what the patches call -----------------------------------------------------------------

    def trained(self, bn, drifts):
        """A training forward of ``bn``: registered at its first; ``drifts`` when no DDP forward broadcast
        the buffers first."""
        import weakref

        if bn.running_mean is None or bn.running_var is None:
            return
        info = self.info.get(id(bn))
        if info is not None and info.ref() is bn:
            if drifts and not info.drifts:
                info.drifts, info.where = True, _call_site(sys._getframe(2))
            return
        owner = -1
        for k, ref in enumerate(self.rank.ddps):
            m = ref()
            if m is not None and any(x is bn for x in m.module.modules()):
                owner = k
                break
        info = _BnLayer(weakref.ref(bn), len(self.order), owner, drifts, _call_site(sys._getframe(2)))
        self.info[id(bn)] = info
        self.order.append(info)

    def uncovered(self, bn):
        """A forward of ``bn`` that no buffer-broadcasting DDP forward preceded."""
        if bn.training:
            info = self.info.get(id(bn))
            if info is None or not info.drifts:
                self.trained(bn, True)
            return
        info = self.info.get(id(bn))
        if info is None or self.eval_steps.get(info.owner) == self.rank.steps:
            return
        if info.ref() is not bn or not bn.track_running_stats or bn.running_mean is None:
            return  # never trained here (statistics as loaded, the same on every rank), or batch statistics
        self.eval_steps[info.owner] = self.rank.steps
        frame = sys._getframe(2)
        self.snapshot("eval", [i for i in self.order if i.owner == info.owner], frame, _call_site(frame))

    def final(self):
        if self.final_done or self.rank.steps == 0 or os.getpid() != self.rank.pid:
            return
        self.final_done = True
        layers = [i for i in self.order if i.drifts]
        if layers:
            self.snapshot("final", layers, None, "")

    # --- the record -----------------------------------------------------------------------------

    def _names(self, frame):
        """Give the layers a name from the modules in the user's frames (``model.module.bn1``), once."""
        want = {id(i.ref()): i for i in self.order if not i.name and i.ref() is not None}
        module_cls = sys.modules["torch.nn.modules.module"].Module
        depth = 0
        while want and frame is not None and depth < 40:
            depth += 1
            if not any(part in frame.f_code.co_filename for part in _LIBRARY):
                for var, value in list(frame.f_locals.items()):
                    pairs = [(var, value)] if isinstance(value, module_cls) else (
                        [(f"self.{a}", v) for a, v in list(vars(value).items()) if isinstance(v, module_cls)]
                        if var == "self" and hasattr(value, "__dict__") else [])
                    for prefix, module in pairs:
                        for n, m in module.named_modules():
                            info = want.pop(id(m), None)
                            if info is not None:
                                info.name = f"{prefix}.{n}" if n else prefix
            frame = frame.f_back

    def snapshot(self, kind, layers, frame, eval_where):
        """Write the layers' running statistics, with why each can drift and the user's line."""
        if os.getpid() != self.rank.pid:
            return  # a forked child (a DataLoader worker): not a rank
        if frame is not None:
            self._names(frame)
        ddps = self.rank.ddps
        rows = []
        for info in layers:
            bn = info.ref()
            if bn is None or bn.running_mean is None:
                continue
            model = ddps[info.owner]() if info.owner >= 0 else None
            built = model.__dict__.get("_ddpdoctor_built", {}) if model is not None else {}
            if info.owner < 0:
                why, where = "no-ddp", info.where
            elif not _syncs_buffers(model):
                why, where = "sync-off", built.get("where", "")
            elif info.drifts:
                why, where = "module-train", info.where
            else:
                why, where = "module-eval", eval_where
            name = info.name or f"BatchNorm layer {info.index} ({type(bn).__name__}({bn.num_features}))"
            rows.append([name, float(bn.eps), bn.running_mean.detach().float().cpu().reshape(-1).tolist(),
                         bn.running_var.detach().float().cpu().reshape(-1).tolist(), why, where])
        if not rows:
            return
        steps = self.rank.steps
        owner = layers[0].owner if kind == "eval" else "all"
        _write_json(self.rank.run_dir, f"bn-{self.rank.pid}-{kind}-{steps}-{owner}.json", {
            "pid": self.rank.pid, "rank": self.rank._rank(), "kind": kind, "step": steps, "owner": owner,
            "layers": rows})


def _syncs_buffers(model):
    """Whether a DDP model broadcasts its buffers at the start of a forward: ``forward_sync_buffers``
    where torch has it, else ``broadcast_buffers``."""
    attrs = model.__dict__  # instance attributes: no Module.__getattr__ (and its exception) per forward
    value = attrs.get("forward_sync_buffers")
    if value is None:
        value = attrs.get("broadcast_buffers", getattr(model, "broadcast_buffers", True))
    return bool(value)


class _TorchLoaded:
    """A ``sys.meta_path`` finder that installs the watches right after ``import torch`` finished."""

    def __init__(self, state):
        self.state = state

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        import importlib.machinery

        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        real = spec.loader.exec_module
        state = self.state

        def exec_module(module):
            real(module)
            try:
                state.install(torch_done=True)
            except Exception:  # noqa: BLE001
                pass

        spec.loader.exec_module = exec_module
        return spec


def start(run_dir, info):
    """Start the watches in this rank (called by the injected sitecustomize); the beat function."""
    global _state
    if not any(enabled(n) for n in ("sampler-epoch", "data-plan", "desync", "solo-wait", "bn-drift")):
        return None
    _state = _Rank(run_dir, info)
    if "torch" in sys.modules:
        _state.install()
    else:
        sys.meta_path.insert(0, _TorchLoaded(_state))
    return _state.beat
