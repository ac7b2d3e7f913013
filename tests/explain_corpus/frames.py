"""How launchers frame a failure: the shapes a real job log has around the error lines.

Used by ``compose.py`` to write the corpus logs once; the committed ``cases/*.log`` files are what
the test reads. Each helper returns a list of lines. The shapes follow the launchers' own output:

- torchrun / ``torch.distributed.run`` (and ``torch.distributed.launch`` since 1.10, and
  ``accelerate launch`` for several processes), in three generations: ``new`` (2.4+: ``[rankN]:``
  prefixes, glog-style ``E1123 ...`` agent lines, ``(SIGKILL)`` after the exit code), ``mid``
  (2.1-2.3: ``[2024-03-16 03:30:01,302] torch.distributed.elastic...: [ERROR]``) and ``old``
  (1.9-2.0: ``ERROR:torch.distributed.elastic.multiprocessing.api:failed``, no rank prefixes);
- ``torch.distributed.launch`` before 1.9 (``Killing subprocess``, ``CalledProcessError``);
- ``torch.multiprocessing.spawn`` (``-- Process 1 terminated with the following error:``);
- Slurm ``srun`` (``srun: error: node: task 1: Exited with exit code 1``, ``--label`` prefixes);
- the DeepSpeed launcher (``sigkill_handler`` ... ``exits with return code = -9``);
- PyTorch Lightning (``Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/4``).
"""

from __future__ import annotations

from itertools import zip_longest

SITE = "/usr/local/lib/python3.10/dist-packages"
CONDA = "/opt/conda/lib/python3.10/site-packages"


def tb(frames, exc, site=SITE):
    """A Python traceback. ``frames``: (file, line, func, code); a file starting with ``torch/``,
    ``accelerate/`` ... is put under ``site``."""
    out = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        if not path.startswith("/") and "/" in path:
            path = f"{site}/{path}"
        out.append(f'  File "{path}", line {line}, in {func}')
        if code:
            out.append(f"    {code}")
    out.extend(exc.split("\n"))
    return out


def interleave(bodies, prefix=True):
    """Lines of several ranks, interleaved line by line the way concurrent writers mix."""
    ranks = sorted(bodies)
    out = []
    for row in zip_longest(*(bodies[r] for r in ranks)):
        for r, line in zip(ranks, row):
            if line is None:
                continue
            out.append(f"[rank{r}]: {line}" if prefix else line)
    return out


_SIGS = {-9: "SIGKILL", -15: "SIGTERM", -7: "SIGBUS", -6: "SIGABRT", -11: "SIGSEGV"}


def _entry(idx, rank, code, pid, fmt, host, when):
    sig = _SIGS.get(code)
    code_txt = f"{code} (pid: {pid})" + (f"  ({sig})" if sig and fmt == "new" else " ")
    trace = (f"Signal {-code} ({sig}) received by PID {pid}" if sig else
             "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
    return [f"[{idx}]:", f"  time      : {when}", f"  host      : {host}",
            f"  rank      : {rank} (local_rank: {rank % 8})", f"  exitcode  : {code_txt.rstrip() if fmt != 'new' else code_txt}",
            "  error_file: <N/A>", f"  traceback : {trace}"]


def torchrun(bodies, root, code, *, script="train.py", fmt="new", host="gpu-node-01", others=(),
             pre=(), when="2024-05-13_10:41:07", prefix=None, launcher="run", site=SITE, python="/usr/bin/python3"):
    """A torchrun job: the ranks' lines, the agent's failure line, its traceback and the summary.

    ``root``: the global rank of the first failure and ``code`` its exit code; ``others``: (rank, code)
    of the other failed ranks.
    """
    if prefix is None:
        prefix = fmt == "new"
    out = list(pre)
    if launcher == "launch":
        out += [f"{site}/torch/distributed/launch.py:181: FutureWarning: The module torch.distributed.launch is deprecated",
                "and will be removed in future. Use torchrun.",
                "Note that --use-env is set by default in torchrun.",
                "If your script expects `--local-rank` argument to be set, please",
                "change it to read from `os.environ['LOCAL_RANK']` instead. See ",
                "https://pytorch.org/docs/stable/distributed.html#launch-utility for ",
                "further instructions", "", "  warnings.warn("]
    out += ["*****************************************",
            "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your "
            "system being overloaded, please further tune the variable for optimal performance in your "
            "application as needed. ", "*****************************************"]
    out += interleave(bodies, prefix)
    pid = 41230 + root
    local = root % 8
    if fmt == "new":
        for r, _ in others:
            if _ == -15:
                out.append(f"W0513 10:41:07.112000 41221 torch/distributed/elastic/multiprocessing/api.py:897] "
                           f"Sending process {41230 + r} closing signal SIGTERM")
        out.append(f"E0513 10:41:07.337000 41221 torch/distributed/elastic/multiprocessing/api.py:869] failed "
                   f"(exitcode: {code}) local_rank: {local} (pid: {pid}) of binary: {python}")
    elif fmt == "mid":
        for r, _ in others:
            if _ == -15:
                out.append(f"[2024-03-16 03:30:01,120] torch.distributed.elastic.multiprocessing.api: [WARNING] "
                           f"Sending process {41230 + r} closing signal SIGTERM")
        out.append(f"[2024-03-16 03:30:01,302] torch.distributed.elastic.multiprocessing.api: [ERROR] failed "
                   f"(exitcode: {code}) local_rank: {local} (pid: {pid}) of binary: {python}")
    else:
        for r, _ in others:
            if _ == -15:
                out.append(f"WARNING:torch.distributed.elastic.multiprocessing.api:Sending process {41230 + r} "
                           "closing signal SIGTERM")
        out.append(f"ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: {code}) "
                   f"local_rank: {local} (pid: {pid}) of binary: {python}")
    entry = "torchrun" if launcher == "run" else launcher
    if entry == "torchrun":
        head = [("/usr/local/bin/torchrun", 8, "<module>", "sys.exit(main())")]
    elif entry == "accelerate":
        head = [("/usr/local/bin/accelerate", 8, "<module>", "sys.exit(main())"),
                ("accelerate/commands/accelerate_cli.py", 48, "main", "args.func(args)"),
                ("accelerate/commands/launch.py", 1097, "launch_command", "multi_gpu_launcher(args)"),
                ("accelerate/commands/launch.py", 734, "multi_gpu_launcher", "distrib_run.run(args)")]
    else:
        head = [("/usr/lib/python3.10/runpy.py", 196, "_run_module_as_main", "return _run_code(code, main_globals, None,"),
                ("/usr/lib/python3.10/runpy.py", 86, "_run_code", "exec(code, run_globals)"),
                ("torch/distributed/launch.py", 198, "<module>", "main()"),
                ("torch/distributed/launch.py", 194, "main", "launch(args)"),
                ("torch/distributed/launch.py", 179, "launch", "run(args)")]
    frames = head + [
        ("torch/distributed/elastic/multiprocessing/errors/__init__.py", 346, "wrapper", "return f(*args, **kwargs)"),
        ("torch/distributed/run.py", 794, "main" if entry != "accelerate" else "run", "run(args)" if entry == "torchrun" else "elastic_launch("),
        ("torch/distributed/launcher/api.py", 134, "__call__", "return launch_agent(self._config, self._entrypoint, list(args))"),
        ("torch/distributed/launcher/api.py", 264, "launch_agent", "raise ChildFailedError(")]
    out += tb(frames, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", site=site)
    bar = "=" * 60
    out += [bar, f"{script} FAILED", "-" * 60, "Failures:"]
    if others:
        for i, (r, c) in enumerate(others, start=1):
            out += _entry(i, r, c, 41230 + r, fmt, host, when)
    else:
        out.append("  <NO_OTHER_FAILURES>")
    out += ["-" * 60, "Root Cause (first observed failure):"]
    out += _entry(0, root, code, pid, fmt, host, when)
    out.append(bar)
    return out


def launch_legacy(bodies, root, code, args, python="/usr/bin/python", site=SITE):
    """``python -m torch.distributed.launch`` before 1.9: no summary, CalledProcessError at the end."""
    out = ["*****************************************",
           "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your "
           "system being overloaded, please further tune the variable for optimal performance in your "
           "application as needed. ", "*****************************************"]
    out += interleave(bodies, prefix=False)
    for r in sorted(bodies):
        out.append(f"Killing subprocess {27630 + r}")
    out += tb([("/usr/lib/python3.7/runpy.py", 193, "_run_module_as_main", '"__main__", mod_spec)'),
               ("/usr/lib/python3.7/runpy.py", 85, "_run_code", "exec(code, run_globals)"),
               ("torch/distributed/launch.py", 340, "<module>", "main()"),
               ("torch/distributed/launch.py", 326, "main", "sigkill_handler(signal.SIGTERM, None)  # not coming back"),
               ("torch/distributed/launch.py", 301, "sigkill_handler", "raise subprocess.CalledProcessError(returncode=last_return_code, cmd=cmd)")],
              f"subprocess.CalledProcessError: Command '[{python!r}, '-u', {args[0]!r}, '--local_rank={root}'"
              + "".join(f", {a!r}" for a in args[1:]) + f"]' returned non-zero exit status {code}.", site=site)
    return out


def spawn(rank, inner, *, script="train.py", line=88, fmt="new", site=SITE, pre=()):
    """``mp.spawn``: the parent's traceback, then the failed child's, after the marker line."""
    out = list(pre)
    exc = "torch.multiprocessing.spawn.ProcessRaisedException: " if fmt == "new" else "Exception: "
    out += tb([(f"/home/user/project/{script}", line, "<module>", "mp.spawn(main_worker, nprocs=ngpus, args=(args,))"),
               ("torch/multiprocessing/spawn.py", 282 if fmt == "new" else 230, "spawn", "return start_processes(fn, args, nprocs, join, daemon, start_method=\"spawn\")"),
               ("torch/multiprocessing/spawn.py", 238 if fmt == "new" else 188, "start_processes", "while not context.join():"),
               ("torch/multiprocessing/spawn.py", 189 if fmt == "new" else 150, "join", "raise ProcessRaisedException(msg, error_index, failed_process.pid)" if fmt == "new" else "raise Exception(msg)")],
              exc, site=site)
    out += ["", f"-- Process {rank} terminated with the following error:"]
    out += inner
    return out


def spawn_signal(rank, sig, *, script="train.py", site=SITE, pre=()):
    out = list(pre)
    out += tb([(f"/home/user/project/{script}", 171, "<module>", "mp.spawn(train, nprocs=world_size, args=(world_size,), join=True)"),
               ("torch/multiprocessing/spawn.py", 282, "spawn", "return start_processes(fn, args, nprocs, join, daemon, start_method=\"spawn\")"),
               ("torch/multiprocessing/spawn.py", 238, "start_processes", "while not context.join():"),
               ("torch/multiprocessing/spawn.py", 170, "join", "raise ProcessExitedException(")],
              f"torch.multiprocessing.spawn.ProcessExitedException: process {rank} terminated with signal {sig}", site=site)
    return out


def slurm(lines, *, label=False, fails=(), node="gpu-a-017", step="4412873.0", tail=()):
    """An ``srun`` step: the tasks' lines (``--label``: ``0: `` prefixes), then srun's verdicts.

    ``lines``: (task, text) pairs; ``fails``: (task, verdict) with verdict an int exit code or text.
    """
    out = [f"{t}: {s}" if label and t is not None else s for t, s in lines]
    out += list(tail)
    for task, verdict in fails:
        what = f"Exited with exit code {verdict}" if isinstance(verdict, int) else verdict
        out.append(f"srun: error: {node}: task {task}: {what}")
    if fails:
        out.append("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.")
    return out


def deepspeed(bodies, rc, args, *, ranks=(0, 1), pre=(), python="/usr/bin/python3"):
    """The DeepSpeed launcher on one node: its banner, the ranks' lines, then sigkill_handler."""
    world = ", ".join(str(r) for r in ranks)
    out = list(pre)
    out += [f"[2023-09-10 11:44:12,004] [INFO] [runner.py:570:main] cmd = {python} -u -m deepspeed.launcher.launch "
            f"--world_info=eyJsb2NhbGhvc3QiOiBbMCwgMV19 --master_addr=127.0.0.1 --master_port=29500 {args[0]}",
            f"[2023-09-10 11:44:14,120] [INFO] [launch.py:145:main] WORLD INFO DICT: {{'localhost': [{world}]}}",
            f"[2023-09-10 11:44:14,120] [INFO] [launch.py:151:main] nnodes=1, num_local_procs={len(ranks)}, node_rank=0",
            f"[2023-09-10 11:44:14,121] [INFO] [launch.py:163:main] dist_world_size={len(ranks)}"]
    out += interleave(bodies, prefix=False)
    for r in ranks:
        out.append(f"[2023-09-10 11:45:59,{207 + r:03d}] [INFO] [launch.py:315:sigkill_handler] Killing subprocess {6293 + r}")
    cmd = ", ".join(repr(a) for a in [python, "-u", args[0], "--local_rank=0"] + list(args[1:]))
    out.append(f"[2023-09-10 11:46:01,771] [ERROR] [launch.py:321:sigkill_handler] [{cmd}] exits with return code = {rc}")
    return out


def lightning_banner(world, *, rank_lines=True, old=False, backend="nccl"):
    out = ["GPU available: True (cuda), used: True", "TPU available: False, using: 0 TPU cores",
           "HPU available: False, using: 0 HPUs"]
    if rank_lines:
        for r in range(world):
            out.append(f"initializing ddp: GLOBAL_RANK: {r}, MEMBER: {r + 1}/{world}" if old else
                       f"Initializing distributed: GLOBAL_RANK: {r}, MEMBER: {r + 1}/{world}")
    out += ["-" * 100, f"distributed_backend={backend}", f"All distributed processes registered. Starting with {world} processes",
            "-" * 100, ""]
    return out


def nccl_info(host, pid, dev, items):
    """NCCL_DEBUG=INFO lines of one process: ``host:pid:tid [dev] NCCL INFO ...``."""
    return [f"{host}:{pid}:{pid + 17} [{dev}] NCCL {'WARN' if it.startswith('!') else 'INFO'} {it.lstrip('!')}"
            for it in items]
