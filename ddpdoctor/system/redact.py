"""Keep secrets out of reports: values of variables whose names look like credentials are hidden."""

from __future__ import annotations

import re
from typing import Mapping

__all__ = ["is_secret_name", "redact_env", "REDACTED"]

REDACTED = "<redacted>"
_SECRET = re.compile(
    r"(TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH|COOKIE|SESSION_?KEY|_KEY$|^KEY$)",
    re.IGNORECASE,
)


def is_secret_name(name: str) -> bool:
    """True for names such as ``HF_TOKEN``, ``WANDB_API_KEY``, ``AWS_SECRET_ACCESS_KEY``."""
    return bool(_SECRET.search(name))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with secret-looking values replaced by ``<redacted>``."""
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}
