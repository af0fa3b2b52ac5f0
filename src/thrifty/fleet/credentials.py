"""Which values of a fleet job are secrets, and the environment variables they travel in.

A job file is written to disk, printed by `--dry-run` and kept by the engine: it holds no
credential. The rule is the one that keeps them out of a run's config.toml
(`thrifty.redact`): a `--set` item or a `--bucket` URL that redaction would change (a URL's
password, a presigned signature, `checkpoint.storage_options`, a token, a key) is written as
a reference to an environment variable, `"$NAME"`, and the file says which variable must be
set. The value comes from the environment that submits the job: `thrifty launch` puts it
there for the engine it starts; SkyPilot takes it from there with `--env NAME` (or
`--secret NAME`), and Slurm exports the submitting environment to the job (`--export=ALL`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from thrifty.fleet.shell import Env, Word
from thrifty.redact import redact_text, redact_value

LOCATION_ENV = "CHECKPOINT_LOCATION"
SET_ENV = "THRIFTY_SET_{}"  # the n-th --set item that holds a secret


@dataclass(frozen=True, slots=True)
class Passed:
    """A value the job file names but never holds: it travels in environment variable
    `name`. `what` says which value it is, in words that quote nothing the user gave."""

    name: str
    value: str = field(repr=False)
    what: str


def holds_secret(text: str) -> bool:
    """True when the redaction of config.toml and logs would change the text."""
    return redact_text(text) != text


def override_holds_secret(item: str) -> bool:
    """A `--set section.key=value` item whose key names a secret or whose value holds one,
    judged as config.toml judges the value it sets (storage_options are all secret)."""
    if holds_secret(item):
        return True
    from thrifty.config import apply_overrides

    key, _, value = item.partition("=")
    nested = apply_overrides({}, [(key.strip(), value.strip())])
    return bool(redact_value(nested) != nested)


def override_words(overrides: Sequence[str]) -> tuple[list[Word], list[Passed]]:
    """The `--set` values as the job file writes them, and the secrets among them.

    A secret item keeps its key in the file and passes its value: `key="$THRIFTY_SET_1"`
    (the whole item when the key itself would be redacted)."""
    words: list[Word] = []
    passed: list[Passed] = []
    for number, item in enumerate(overrides, 1):
        if not override_holds_secret(item):
            words.append(item)
            continue
        name = SET_ENV.format(len(passed) + 1)
        key, _, value = item.partition("=")
        if holds_secret(f"{key}="):
            words.append(Env(name))
            passed.append(Passed(name, item, f"the whole --set number {number} (KEY=VALUE)"))
        else:
            words.append((f"{key}=", Env(name)))
            passed.append(Passed(name, value, f"the value of --set number {number}"))
    return words, passed


def location_word(location: str, in_env: bool) -> tuple[Word, Passed | None]:
    """`checkpoint.location=URL` as the job file writes it: the URL itself, or a reference to
    LOCATION_ENV when `in_env` (the engine sets it) or when the URL holds a secret."""
    if holds_secret(location):
        passed = Passed(LOCATION_ENV, location, "the checkpoint location (--bucket)")
        return ("checkpoint.location=", Env(LOCATION_ENV)), passed
    if in_env:
        return ("checkpoint.location=", Env(LOCATION_ENV)), None
    return f"checkpoint.location={location}", None


def described(passed: Sequence[Passed]) -> list[str]:
    """Comment lines naming each variable the submitting environment must set."""
    if not passed:
        return []
    lines = ["Set in the submitting environment (the values are never written here):"]
    return lines + [f"  {p.name}: {p.what}" for p in passed]
