"""The check runner: forms a world of ranks, drives every rank through the checks, gathers the outcomes.

Local worlds (:mod:`.local`: ddpdoctor forks the ranks) and joined worlds (:mod:`.joined`: torchrun,
srun or mpirun started them) share the rest: :mod:`.options` (what a run is asked to do),
:mod:`.registry` (which checks), :mod:`.supervisor` and :mod:`.worker` (one forked process per rank),
:mod:`.lockstep` (drives the ranks check by check, merges their outcomes), :mod:`.verdict` (the rank
that failed first is the cause, the ranks left waiting its consequence), :mod:`.channel` (the control
channel, a TCPStore independent of the backend under test) and :mod:`.bench` (``ddpdoctor bench``).

May import: ``ddpdoctor.checks``, ``ddpdoctor.report``, ``ddpdoctor.diagnostics``, ``ddpdoctor.training``,
``ddpdoctor.causes``, ``ddpdoctor.system`` and the shared bottom (``check``, ``result``, ``errors``,
``exitcodes``). Never ``ddpdoctor.cli`` or ``ddpdoctor.postmortem``.
"""
