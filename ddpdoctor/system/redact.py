"""Text that is safe to show and to paste: secrets hidden, control characters escaped.

The one step every text from outside ddpdoctor goes through on its way to an output (the terminal
report, ``--json``, ``env``, ``explain``, ``stacks``, ``run``'s verdict and the run directory's
``verdict.txt``, ``verdict.json``, ``stacks.txt`` and ``proc-<pid>.json``). Each output applies it once,
where it writes (see :func:`safe_text` and :func:`safe_data`); the job's own output (``run``'s
pass-through and ``output.raw.log``, mode 0600) is never changed.

- :func:`redact_env` hides the values of variables whose names look like credentials;
- :func:`redact_text` hides secrets inside free text: URL userinfo (``etcd://user:secret@host``),
  ``Authorization:`` headers (also as Python prints a dict: ``{'Authorization': 'Bearer ...'}``),
  ``Bearer`` tokens, ``NAME=value`` / ``NAME: value`` where NAME looks like a credential (``HF_TOKEN=...``,
  ``"db_password": "two words"``: a quoted value is hidden whole), command-line flags
  (``--api-key=...``, ``--password VALUE``, ``--token VALUE``), and tokens known by their shape
  (Hugging Face ``hf_...``, GitHub ``ghp_...``/``github_pat_...``, AWS access key ids ``AKIA...``);
- :func:`redact_argv` does the same for a process's argument list (a flag's value is the next word);
- :func:`escape_controls` turns control characters (ESC, CR, NUL, DEL, C1, bidi overrides) into
  visible escapes, so a log line or a process name cannot move the cursor or recolor the terminal;
- :func:`escape_undecodable` shows bytes that did not decode as UTF-8 (a variable, an argument, a host
  name: Python keeps them as lone surrogates, which no strict UTF-8 output can write) as ``\\xff``;
- :func:`safe_text` does both: use it on anything quoted from outside ddpdoctor; :func:`safe_data` on
  every string of a JSON document;
- :func:`shorten` cuts a text for display *after* redacting it, so that a cut never leaves a secret
  too short to be recognised (half a token, a URL password without its ``@``).

Names that merely contain a credential word stay as they are (``hf_hub_download``, ``token_ids``,
``api_key_env``, ``tokenizer``, ``password_file``, ``--max-tokens 512``), and so does a value that is
itself a variable named like a credential (``token=hf_token``, ``password=args.password``: code in a
traceback, not a secret).

This module imports only the standard library: ``ddpdoctor run``'s hook loads it by path inside the
job's own interpreter to redact ``proc-<pid>.json`` (see :mod:`ddpdoctor.postmortem.inject.sitecustomize`).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

__all__ = ["is_secret_name", "redact_env", "redact_text", "redact_value", "redact_argv", "escape_controls", "shorten_middle",
           "escape_undecodable", "safe_text", "safe_data", "shorten", "REDACTED"]

REDACTED = "<redacted>"
_SECRET = re.compile(
    r"(TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH|COOKIE|SESSION_?KEY|_KEY$|^KEY$)",
    re.IGNORECASE,
)
# The words that make a name (a variable, a key, a flag) a credential's.
_WORDS = (r"(?:TOKEN|SECRET|PASSW(?:OR)?D|PASSPHRASE|API[_-]?KEY|ACCESS[_-]?KEY|PRIVATE[_-]?KEY|CREDENTIALS?|"
          r"SESSION[_-]?KEY|[_-]KEY)")


def _value(bare: str) -> str:
    """The pattern of a value after a name: quoted (hidden whole, spaces included, up to its closing quote
    or the end of the line) or ``bare``. Groups 3-6: the opening quote, the quoted body, the closing
    quote (empty at the end of a line), the bare value (every pattern below puts the name in group 1
    and the separator in group 2)."""
    return (r"""(?:(["'])((?:\\.|(?!\3)[^\\\r\n]){0,4096})(\3|(?=[\r\n])|\Z)|(""" + bare + "))")


_BARE = r"""[^\s"',;&]{1,4096}"""
# ://user:password@host -> the password; ://token@host -> the token (userinfo is a secret). The scheme
# before "://" is kept as it is, so the pattern starts at "://" (one try per URL, not per letter).
# The userinfo runs to the LAST "@" of the authority (as URL parsers read it), so a password with a raw
# "@" in it (``redis://:pa@ss@host``) is hidden whole, not cut at its own "@".
_USERINFO = re.compile(r"://([^\s/@:]{0,256}:)?([^\s/]{1,1024})@")
# Authorization: Bearer xyz / 'Authorization': 'Bearer xyz' / X-Api-Key: xyz (bare: up to the end of the
# line, since a header's value has spaces).
_AUTH_HEADER = re.compile(r"((?:Proxy-)?Authorization|X-Api-Key|X-Auth-Token|Cookie|Set-Cookie)"
                          r"([\"']?\s{0,8}[:=]\s{0,8})" + _value(r"[^\r\n]{1,4096}"), re.IGNORECASE)
# NAME=value, NAME: value, "NAME": "value", --name=value. The pattern starts at the credential word
# (what comes before it in the name is kept as it is): one try per word, never a scan back per position.
_NAMED = re.compile(r"(" + _WORDS + r"\b[\"']?)(\s{0,8}[:=]\s{0,8})" + _value(_BARE), re.IGNORECASE)
# --password VALUE, -token VALUE: a credential word ending a flag (see _is_flag), spaces, a value that is
# not the next flag.
_FLAG = re.compile(r"(" + _WORDS + r")(?![\w-])([ \t]{1,8})(?!-)" + _value(_BARE), re.IGNORECASE)
_FLAG_START = re.compile(r"[A-Za-z0-9_.\-]{0,64}$")
_FLAG_WORD = re.compile(r"--?[A-Za-z0-9_.\-]{0,64}?" + _WORDS, re.IGNORECASE)
# Bearer <token> outside a header: 16 characters or more, a digit among them ("Bearer authentication" stays).
_BEARER = re.compile(r"\b([Bb]earer\s{1,8})(?=[A-Za-z\-._~+/]{0,4096}\d)([A-Za-z0-9\-._~+/]{16,4096}=*)")
# Tokens known by their shape alone.
_SHAPES = re.compile(r"(?<![A-Za-z0-9_])(?:hf_[A-Za-z0-9]{34,}|gh[pousr]_[A-Za-z0-9]{36,}|github_pat_\w{22,}|"
                     r"(?:AKIA|ASIA)[0-9A-Z]{16})")
_SHAPE_HINTS = ("hf_", "gh", "github_pat_", "AKIA", "ASIA")
# What a text must hold (lower-cased) for the patterns above to find anything in it.
_HEADER_HINTS = ("authorization", "x-api-key", "x-auth-token", "cookie")
_WORD_HINTS = ("token", "secret", "passw", "passphrase", "key", "credential")
# A value that is a variable named like a credential (hf_token, args.password, self.api_key) in a call
# (followed by "," or ")"): code in a traceback, not a secret.
_VARIABLE = re.compile(r"(?:[A-Za-z_]\w{0,63}\.){0,8}(?:\w{0,64}_)?" + _WORDS.replace("|[_-]KEY", "|KEY"),
                       re.IGNORECASE)

_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SURROGATES = re.compile("[\ud800-\udfff]")
_NAMES = {"\r": "\\r", "\x1b": "\\e", "\t": "\\t", "\n": "\\n", "\x00": "\\0"}


def is_secret_name(name: str) -> bool:
    """True for names such as ``HF_TOKEN``, ``WANDB_API_KEY``, ``AWS_SECRET_ACCESS_KEY``."""
    return bool(_SECRET.search(name))


def _is_flag(m: "re.Match[str]") -> bool:
    """Whether the word that ends in the match's credential word is a flag (``--api-key``, ``-token``)."""
    word = _FLAG_START.search(m.string, max(0, m.start() - 64), m.start()).group(0)
    start = m.start() - len(word)
    return word.startswith("-") and (start == 0 or not m.string[start - 1].isalnum())


def _hide_flag_value(m: "re.Match[str]") -> str:
    return _hide_value(m) if _is_flag(m) else m.group(0)


def _hide_value(m: "re.Match[str]") -> str:
    """The name and separator (groups 1-2) with the value after them hidden (its quotes kept); the match
    unchanged when the value is already hidden, or is a variable named like a credential or a constant
    passed in a call (``token=hf_token)``, ``password=args.password,``, ``add_to_git_credential=False)``):
    code in a traceback, not a secret."""
    head = m.group(1) + m.group(2)
    quote, close, bare = m.group(3), m.group(5), m.group(6)
    if quote is not None:
        return f"{head}{quote}{REDACTED}{close}"
    if bare == REDACTED:
        return m.group(0)
    code = bare.rstrip(")")
    called = code != bare or m.string[m.end():m.end() + 1] == ","
    if called and (code in ("True", "False", "None") or _VARIABLE.fullmatch(code)):
        return m.group(0)
    return f"{head}{REDACTED}"


def redact_text(text: str) -> str:
    """``text`` with secrets replaced by ``<redacted>``: URL userinfo, Authorization-style headers, Bearer
    tokens, NAME=secret values, credential flags' values, and tokens known by their shape.

    Each pattern runs only where the text holds the words it needs (``in`` is much cheaper than a
    case-insensitive regex search): the answer is the same."""
    if not text:
        return text
    if "://" in text:
        text = _USERINFO.sub(lambda m: f"://{m.group(1) or ''}{REDACTED}@", text)
    low = text.lower()
    if any(h in low for h in _HEADER_HINTS):
        text = _AUTH_HEADER.sub(_hide_value, text)
    if "bearer" in low:
        text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    if any(h in low for h in _WORD_HINTS):
        text = _NAMED.sub(_hide_value, text)
        if "-" in text:
            text = _FLAG.sub(_hide_flag_value, text)
    if any(h in text for h in _SHAPE_HINTS):
        text = _SHAPES.sub(REDACTED, text)
    return text


def redact_argv(argv: Sequence[str]) -> list:
    """A process's arguments as they may be shown: each redacted, and the word after a credential flag
    (``--password``, ``--token``, ``--api-key``) hidden whole, spaces and all."""
    out: list = []
    hide_next = False
    for word in argv:
        word = str(word)
        if hide_next and not word.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = bool(_FLAG_WORD.fullmatch(word))
        out.append(redact_text(word))
    return out


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
    """Anything quoted from outside ddpdoctor (a log line, a process name, a variable): redacted, then escaped.

    Applying it twice gives the same text as once, so an output may apply it to lines that hold
    already safe parts."""
    return escape_controls(redact_text(str(text)))


def safe_data(value: Any) -> Any:
    """A JSON-like ``value`` with every string (keys included) passed through :func:`safe_text`: what a
    JSON document holds is what the terminal would show."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {safe_text(k) if isinstance(k, str) else k: safe_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [safe_data(v) for v in value]
    return value


def shorten(text: str, limit: int) -> str:
    """``text`` redacted, then cut to ``limit`` characters (``...`` at the end when cut): a cut made before
    redacting could leave half a token or a URL password without its ``@``, which nothing recognises."""
    text = redact_text(text)
    return text if len(text) <= limit else text[:max(0, limit - 3)] + "..."


def shorten_middle(text: str, limit: int) -> str:
    """``text`` redacted, then cut to ``limit`` characters in the middle (`` ... ``), keeping its start and
    its last third: an exception's key words are often at its end (``name: EADDRINUSE``, NCCL's ``Last
    error:``), and an end cut lost them (``EADDRI...``)."""
    text = redact_text(text)
    if len(text) <= limit:
        return text
    tail = max(0, (limit - 5) // 3)
    return text[:max(0, limit - 5 - tail)] + " ... " + (text[-tail:] if tail else "")
