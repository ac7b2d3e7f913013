"""Tools for a job that already ran or is running: ``ddpdoctor run`` (:mod:`.jobrun`), ``stacks``
(:mod:`.stacks`), ``explain`` (:mod:`.explain`; ``explain --fr``: :mod:`.flight_recorder` reads Flight Recorder dumps,
:mod:`.divergence` finds where the ranks' collectives part) and the start-up hook ``run`` injects into the job
(``inject/sitecustomize.py``, shipped as a file, never imported by ddpdoctor itself).

May import: ``ddpdoctor.causes`` (the catalogue of known causes), ``ddpdoctor.system`` and the shared
bottom. Never the runner, the checks or ``ddpdoctor.cli``.
"""
