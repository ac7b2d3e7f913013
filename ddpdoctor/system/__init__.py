"""Facts about this machine and its processes: NVML (:mod:`.nvml`), environment variables
(:mod:`.envvars`), redaction of secrets (:mod:`.redact`), ports (:mod:`.ports`), how a process ended
(:mod:`.signals`) and where a Python stack dump is blocked (:mod:`.stackframes`).

May import: the shared bottom (``result``, ``errors``, ``exitcodes``) only.
"""
