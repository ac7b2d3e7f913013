"""The one table of secret shapes every output test feeds to ddpdoctor, and the names that must stay.

Each shape is a text as it appears in the wild (a URL, a command line, a header, a Python dict, a
token known by its form) with the secret inside it. A test puts the texts where the job, the log, the
environment or a process's command line carries them, runs the real command, and asserts with
:func:`leaks` that no piece of any secret (8 characters in a row) reached the output, and with
:func:`raw_controls` that no terminal escape did. The negative table holds names that only look like
credentials (``hf_hub_download``, ``token_ids``): they must come through unchanged.

Every secret is unique, so a failure names the shape that leaked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Shape", "SHAPES", "NEGATIVES", "ESCAPE", "leaks", "raw_controls", "message", "argv"]


@dataclass(frozen=True)
class Shape:
    """``text`` carries ``secret``; ``words`` is how it is passed as a command's arguments."""

    name: str
    text: str
    secret: str
    words: tuple = ()

    @property
    def argv(self) -> list:
        return list(self.words or (self.text,))


_HF = "hf_" + "Qh7Xk2Lm9Np4Rs6Tv8Wy1Za3Bc5De7Fg9Hj"  # 34 after the prefix
_GH = "ghp_" + "Gk2Mn4Pq6Rs8Tu1Vw3Xy5Za7Bc9De2Fg4Hj6K"  # 36 after the prefix
_AWS = "AKIA" + "Z7Q2W4E6R8T1Y3U5"  # 16 after the prefix

SHAPES = (
    Shape("url-password", "https://alice:UrlPw7Kq2Zx@git.example.com/repo.git", "UrlPw7Kq2Zx"),
    Shape("url-token", "https://UrlTok5Hn8Vb@github.com/org/repo.git", "UrlTok5Hn8Vb"),
    Shape("flag-equals", "--api-key=FlagEq4Jd9Ws", "FlagEq4Jd9Ws"),
    Shape("flag-password", "--password FlagPw3Lr6Yc", "FlagPw3Lr6Yc", ("--password", "FlagPw3Lr6Yc")),
    Shape("flag-token", "--token FlagTk8Mv2Qe", "FlagTk8Mv2Qe", ("--token", "FlagTk8Mv2Qe")),
    Shape("dict-authorization", "{'Authorization': 'Bearer DictBr6Tg1Pz4Kw'}", "DictBr6Tg1Pz4Kw"),
    Shape("header", "Authorization: Bearer HeadBr2Nc7Xs5Lq", "HeadBr2Nc7Xs5Lq"),
    Shape("quoted-with-space", "password='Quoted9 Spaced4Pw'", "Quoted9 Spaced4Pw"),
    Shape("env-assignment", "HF_TOKEN=EnvTok1Rb5Gm", "EnvTok1Rb5Gm"),
    Shape("json-key", '"db_password": "JsonPw8Fk3Dn"', "JsonPw8Fk3Dn"),
    Shape("hf-token", f"token {_HF}", _HF),
    Shape("github-token", f"pushed with {_GH}", _GH),
    Shape("aws-key-id", f"key id {_AWS}", _AWS),
)

# A terminal escape: set the window title, clear the screen, ring the bell.
ESCAPE = "\x1b]0;owned\x07\x1b[2J"

# Lines (as tracebacks and command lines print them) that look like credentials and are not.
NEGATIVES = (
    '  File "/venv/lib/python3.11/site-packages/huggingface_hub/file_download.py", line 862, in hf_hub_download',
    '    token_ids = tokenizer(text)["input_ids"]',
    '    api_key_env = os.environ.get("WANDB_API_KEY_ENV", "WANDB_API_KEY")',
    "    tokenizer = AutoTokenizer.from_pretrained(model_name, use_fast=True)",
    "    with open(args.password_file) as f:",
    "KeyError: 'password_file'",
    "    path = hf_hub_download(repo_id, filename, token=token)",
    "    login(token=hf_token, add_to_git_credential=False)",
    "train.py --max-tokens 512 --tokenizer gpt2 --token-file /run/tok --password-file /run/pw",
    "ValueError: unexpected token in the prompt template",
    "Bearer authentication failed: check the header",
)


def message(shape: Shape) -> str:
    """An exception message that carries the shape and a terminal escape."""
    return f"upload failed {ESCAPE} with {shape.text}"


def argv(shapes=SHAPES) -> list:
    """Command-line arguments that carry every shape."""
    return [w for s in shapes for w in s.argv]


def leaks(text: str, shapes=SHAPES) -> list:
    """The names of the shapes any 8 characters in a row of whose secret appear in ``text``."""
    out = []
    for s in shapes:
        pieces = {s.secret[i:i + 8] for i in range(0, max(1, len(s.secret) - 7))}
        if any(p in text for p in pieces):
            out.append(s.name)
    return out


_RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def raw_controls(text: str) -> list:
    """Raw control characters in ``text`` (newlines and tabs between lines are allowed)."""
    return sorted(set(_RAW.findall(text)))
