"""Locating the bad node, link or group of nodes of a big job: the plan of test rounds and its verdict
(:mod:`.planner`, pure and deterministic, so every rank computes the same next round), and a modelled
network to run the same plan at scales no test machine has (:mod:`.simulation`).

The check that runs the plan in a real world is ``ddpdoctor.checks.locate``; the command is
``ddpdoctor locate`` (:mod:`ddpdoctor.runner.locate`).

May import: the shared bottom only (``result``, ``errors``, ``exitcodes``).
"""
