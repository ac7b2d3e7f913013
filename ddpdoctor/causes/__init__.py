"""The catalogue of known causes (:mod:`.catalogue`, data) and the matcher that finds them in a message
or a job log (:mod:`.matcher`). ``ddpdoctor explain`` and ``ddpdoctor run`` read it, and so may the
runner (a failing rank's own message, named with its fix).

May import: ``ddpdoctor.system`` and the shared bottom only.
"""
