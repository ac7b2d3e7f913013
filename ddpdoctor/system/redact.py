"""Text that is safe to show and to paste: secrets hidden, control characters escaped.

The one place for both (the report, JSON, ``env``, ``explain`` and ``stacks`` go through here):

- :func:`redact_env` hides the values of variables whose names look like credentials;
- :func:`redact_text` hides secrets inside free text: URL userinfo (``etcd://user:secret@host``),
  ``Authorization:`` headers, and ``NAME=value`` / ``NAME: value`` where NAME looks like a credential
  (``HF_TOKEN=...``, ``"db_password": "..."``);
- :func:`escape_controls` turns control characters (ESC, CR, NUL, DEL, C1, bidi overrides) into
  visible escapes, so a log line or a process name cannot move the cursor or recolor the terminal;
- :func:`escape_undecodable` shows bytes that did not decode as UTF-8 (a variable, an argument, a host
  name: Python keeps them as lone surrogates, which no strict UTF-8 output can write) as ``\\xff``;
- :func:`safe_text` does both: use it on anything quoted from outside ddpdoctor.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

__all__ = ["is_secret_name", "redact_env", "redact_text", "redact_value", "escape_controls", "escape_undecodable",
           "safe_text", "REDACTED"]

REDACTED = "<redacted>"
_SECRET = re.compile(
    r"(TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH|COOKIE|SESSION_?KEY|_KEY$|^KEY$)",
    re.IGNORECASE,
)
# scheme://user:password@host -> the password; scheme://token@host -> the token (userinfo is a secret).
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]{0,31}://)([^\s/@:]{0,256}:)?([^\s/@]{1,1024})@")
# Authorization: Bearer xyz / Proxy-Authorization: Basic xyz / X-Api-Key: xyz (up to the end of the line).
_AUTH_HEADER = re.compile(r"((?:Proxy-)?Authorization|X-Api-Key|X-Auth-Token|Cookie|Set-Cookie)"
                          r"(\"?\s{0,8}[:=]\s{0,8})([^\r\n]{1,4096})", re.IGNORECASE)
# NAME=value, NAME: value, "NAME": "value", --name value-less forms are not guessed.
_NAMED = re.compile(
    r"([A-Za-z0-9_.\-]{0,64}(?:TOKEN|SECRET|PASSW(?:OR)?D|PASSPHRASE|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|"
    r"CREDENTIALS?|SESSION_?KEY|_KEY)\b[\"']?)(\s{0,8}[:=]\s{0,8})([\"']?)([^\s\"',;&]{1,4096})",
    re.IGNORECASE,
)
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SURROGATES = re.compile("[\ud800-\udfff]")
_NAMES = {"\r": "\\r", "\x1b": "\\e", "\t": "\\t", "\n": "\\n", "\x00": "\\0"}


def is_secret_name(name: str) -> bool:
    """True for names such as ``HF_TOKEN``, ``WANDB_API_KEY``, ``AWS_SECRET_ACCESS_KEY``."""
    return bool(_SECRET.search(name))


def redact_text(text: str) -> str:
    """``text`` with URL userinfo, Authorization-style headers and NAME=secret values replaced by ``<redacted>``."""
    if not text:
        return text
    if "://" in text:
        text = _USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}{REDACTED}@"
                             if m.group(2) else f"{m.group(1)}{REDACTED}@", text)
    text = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    return _NAMED.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3)}{REDACTED}", text)


def redact_value(name: str, value: str) -> str:
    """One variable's value as it may be shown: hidden whole for a secret-looking name, else redacted inside."""
    return REDACTED if is_secret_name(name) else redact_text(value)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with secret-looking values replaced by ``<redacted>`` and secrets inside values
    (``etcd://user:secret@host``) hidden."""
    return {k: redact_value(k, v) for k, v in env.items()}


def escape_controls(text: str) -> str:
    r"""``text`` with control characters shown as escapes (``\e``, ``\r``, ``\x07``, ``\u202e``); tabs and
    newlines too, so one quoted line stays one line; undecodable bytes as :func:`escape_undecodable` shows them."""
    text = escape_undecodable(text)
    if not _CONTROLS.search(text):
        return text

    def one(m: "re.Match[str]") -> str:
        ch = m.group(0)
        if ch in _NAMES:
            return _NAMES[ch]
        return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"

    return _CONTROLS.sub(one, text)


def escape_undecodable(text: str) -> str:
    r"""``text`` with each byte that did not decode (``os.environ``, ``sys.argv`` and ``socket.gethostname``
    keep one as a lone surrogate, U+DC80-U+DCFF) shown as ``\xff``, and any other lone surrogate as
    ``\udXXX``: the result encodes in strict UTF-8 and says which bytes were there."""
    if not _SURROGATES.search(text):
        return text

    def one(m: "re.Match[str]") -> str:
        code = ord(m.group(0))
        return f"\\x{code - 0xdc00:02x}" if 0xdc80 <= code <= 0xdcff else f"\\u{code:04x}"

    return _SURROGATES.sub(one, text)


def safe_text(text: Any) -> str:
    """Anything quoted from outside ddpdoctor (a log line, a process name, a variable): redacted, then escaped."""
    return escape_controls(redact_text(str(text)))
