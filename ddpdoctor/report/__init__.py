"""The run's report: the document (:mod:`.document`, JSON schema 1), its terminal rendering
(:mod:`.terminal`, the only place status glyphs live) and the progress interface the runner calls
(:mod:`.progress`).

May import: the shared bottom (``check``, ``result``, ``errors``, ``exitcodes``) and
``ddpdoctor.system``. Never the runner, the checks or the library.
"""
