"""Shell words for the job files: every value arrives as exactly the text the user gave.

A job file's command is a list of words. A word is literal text (quoted with `shlex.quote`,
so `$( )`, backticks, `;`, spaces and newlines stay text), a reference to an environment
variable (`"$NAME"`, which the engine fills in: a secret, a node's address), or both joined
(`checkpoint.location="$CHECKPOINT_LOCATION"`). Nothing is ever pasted into a script
unquoted, so no value can become a command.

Two kinds of value cannot travel at all and are refused by `check_travels`: a NUL byte (no
command line, environment variable or file name can hold one) and text that is not Unicode
(a name given in bytes that are not UTF-8, which Python keeps as lone surrogates: no YAML or
UTF-8 script can hold them).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from thrifty.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Env:
    """`"$NAME"`: an environment variable's value, filled in where the job runs."""

    name: str


Part = str | Env
# A literal, a variable, or the parts of one word joined without spaces.
Word = str | Env | tuple[Part, ...]


def render(word: Word) -> str:
    """The word as bash reads it back: one argument, whatever the text holds."""
    parts: tuple[Part, ...] = word if isinstance(word, tuple) else (word,)
    text = "".join(f'"${p.name}"' if isinstance(p, Env) else shlex.quote(p) for p in parts if p)
    return text or "''"  # an empty literal is still an argument


def command(lines: Sequence[Sequence[Word]], indent: str = "    ") -> str:
    """One command written over several lines (`\\` continuations); each inner sequence is
    the words of one line, e.g. an option and its value."""
    return f" \\\n{indent}".join(" ".join(render(w) for w in line) for line in lines if line)


def check_travels(value: str, what: str) -> None:
    """Refuse, in one line naming `what` (never the value: it may be a secret), a value no
    job file can carry as it is."""
    if "\0" in value:
        raise ConfigError(
            f"{what} holds a NUL byte, which no command line or environment variable can "
            "carry: remove it"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(
            f"{what} is not valid UTF-8 text (bytes the job file cannot hold): give it in UTF-8"
        ) from None
