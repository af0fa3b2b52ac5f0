"""One place that keeps secrets off disk and out of logs.

Everything thrifty writes (config.toml, the config stored in every checkpoint, metrics.jsonl,
summary.json, diagnosis.json, log lines) goes through `redact_value` or `redact_text`:

- URLs lose their `user:password@` part (a password may hold `/`, `:` or `@`) and the values
  of query parameters that sign or authorize a request (S3 and GCS presigned URLs, Azure SAS).
- The same, percent-encoded once or more, as another library quotes a URL it built from ours
  (botocore's `.../prefix%3FX-Amz-Signature%3D...`, `https%3A%2F%2Fuser%3Apassword%40host`):
  a word whose decoded form still holds a secret after that is masked as a whole.
- Bare AWS access key ids (`AKIA...`, `ASIA...`) and `Bearer`/`Basic` credentials are masked.
- `name=value` and `name: value` pairs whose name says secret (`aws_secret_access_key=...`,
  `AccountKey=...` in a connection string, `"token": "..."`) lose their value.
- In a dict, the value of a key that names a secret is replaced; numbers and booleans stay
  (`key_dim = 64` is not a secret), so the rule never breaks a model's arguments.
- `storage_options` is written as `{}`: see `redact_value`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from collections.abc import Iterator, Mapping
from typing import Any

REDACTED = "<redacted>"

# --------------------------------------------------------------------------------------------
# Which names are secret


# Words that make a key secret wherever they appear in it (compared word by word, so that
# `tokens` or `max_tokens` are not secrets and `aws_session_token` is).
_SECRET_WORDS = {
    "secret",
    "secrets",
    "password",
    "passwd",
    "pwd",
    "passphrase",
    "credential",
    "credentials",
    "signature",
    "sig",
    "auth",
    "authorization",
    "session",
    "cookie",
    "apikey",
    "token",
}
# `key` alone is secret (s3fs's storage_options use it), and so is `access_key`, `AccountKey`
# or `api_key`; `key_dim` or `text_key` name model and data arguments, not credentials.
_KEY_QUALIFIERS = {
    "access",
    "secret",
    "api",
    "private",
    "account",
    "master",
    "signing",
    "encryption",
    "sas",
    "shared",
    "client",
    "storage",
    "auth",
    "session",
    "service",
}
# Tokenizer settings (`pad_token = "<pad>"`) are not credentials.
_TOKENIZER_WORDS = {"pad", "eos", "bos", "unk", "sep", "cls", "mask", "special", "start", "end"}
_WHOLE_SECRET_NAMES = {"connection_string", "conn_str", "connectionstring"}


def _words(name: str) -> list[str]:
    """`AWSAccessKeyId` -> aws access key id; `X-Amz-Security-Token` -> x amz security token."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    spaced = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", spaced)
    return [w for w in re.split(r"[^a-z0-9]+", spaced.lower()) if w]


@functools.lru_cache(maxsize=4096)  # metrics records repeat the same few keys every step
def is_secret_name(name: str) -> bool:
    """True when a key or parameter name says that its value is a credential."""
    if name.lower() in _WHOLE_SECRET_NAMES:
        return True
    words = _words(name)
    for i, word in enumerate(words):
        before = words[i - 1] if i else ""
        if word == "token" and before in _TOKENIZER_WORDS:
            continue
        if word in _SECRET_WORDS:
            return True
        if word == "key" and (len(words) == 1 or before in _KEY_QUALIFIERS):
            return True
    return False


# --------------------------------------------------------------------------------------------
# Text

# `scheme://userinfo@`: everything up to the last `@` of the URL counts, because a password
# may hold `/`, `:` or `@` (cutting part of a path by mistake is harmless; leaking is not).
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^\s'\"<>@]*(?:@[^\s'\"<>@]*)*@")
# A URL's `user:password@` quoted without its scheme, as a storage library's error repeats the
# part of the URL it took for a bucket name ("Invalid bucket name "KEY:SECRET@bucket"").
_BARE_USERINFO = re.compile(r"(?<![\w.:/@-])[^\s'\"<>@/:]+:[^\s'\"<>@/]+@(?=[A-Za-z0-9])")
_QUERY_PARAM = re.compile(r"(?P<lead>[?&;])(?P<name>[^=&#\s'\"]+)=(?P<value>[^&#\s'\"]*)")
_AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{12,}\b")
_BEARER = re.compile(r"(?i)\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{6,}")
_PAIR = re.compile(r"(?P<name>[A-Za-z_][\w.-]*)(?P<quote>[\"']?)\s*[=:]\s*")
_VALUE_END = re.compile(r"[\s,;&)}\]\"']")
# A factory's import path (`my_pkg.auth:build_model`), as `[task]` names one: the module's name
# may hold a secret word, but the text is code's address, not a `name: value` pair.
_IMPORT_PATH = re.compile(
    r"[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*"
)


# The same two, percent-encoded once or more (`%3F`, `%253F`): a URL another library built
# from one of ours and quotes in its error, its query written into the object key's path.
_PCT = r"%(?:25)*"
_ENCODED_USERINFO = re.compile(
    rf"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*{_PCT}3[Aa]{_PCT}2[Ff]{_PCT}2[Ff])[^\s'\"<>@&]*{_PCT}40"
)
# A name of URL-safe characters only (what encoding leaves as is) after an encoded `?`, `&`, `;`
# or `/`, or at the start of a word; its value runs to the next `&`, encoded or not.
_ENCODED_PARAM = re.compile(
    rf"(?P<lead>[?&;]|{_PCT}(?:3[Ff]|26|3[Bb]|2[Ff])|(?<![\w.~%-]))"
    rf"(?P<name>[A-Za-z0-9_.~-]+)(?P<eq>=|{_PCT}3[Dd])"
    rf"(?P<value>(?:(?!{_PCT}26)[^&#\s'\"<>])*)"
)
_ENCODED_WORD = re.compile(r"[^\s'\"<>]*%[0-9A-Fa-f]{2}[^\s'\"<>]*")
_DECODE_ROUNDS = 3  # a URL quoted inside a URL inside a URL is as deep as anyone encodes


def _redact_query(match: re.Match[str]) -> str:
    if not match.group("value") or not is_secret_name(match.group("name")):
        return match.group(0)  # an empty value holds nothing to mask
    return f"{match.group('lead')}{match.group('name')}={REDACTED}"


def _redact_encoded_query(match: re.Match[str]) -> str:
    value = match.group("value")
    if not value or value == REDACTED or not is_secret_name(match.group("name")):
        return match.group(0)
    return f"{match.group('lead')}{match.group('name')}{match.group('eq')}{REDACTED}"


def _redact_encoded(text: str) -> str:
    """Percent-encoded URLs' credentials and signing parameters masked, the text kept encoded;
    then any word that decodes (up to three times) to text that still holds a secret is
    masked whole: what no pattern above foresaw is not printed."""
    if "%" not in text:
        return text
    text = _ENCODED_USERINFO.sub(r"\g<scheme>", text)
    text = _ENCODED_PARAM.sub(_redact_encoded_query, text)
    return _ENCODED_WORD.sub(_mask_decoded_secret, text)


def _mask_decoded_secret(match: re.Match[str]) -> str:
    from urllib.parse import unquote

    word = decoded = match.group(0)
    for _ in range(_DECODE_ROUNDS):
        decoded, before = unquote(decoded), decoded
        if decoded == before:
            break
    if decoded == word or _redact_plain(decoded) == decoded:
        return word
    return REDACTED


def _redact_pairs(text: str) -> str:
    """Mask the value after `name=` or `name: ` when the name is a secret's."""
    out: list[str] = []
    pos = 0
    for match in _PAIR.finditer(text):
        if match.start() < pos or not is_secret_name(match.group("name")):
            continue
        start = match.end()
        if start >= len(text) or text.startswith("//", start):  # a URL's scheme, not a pair
            continue
        if text[start] in "\"'":  # a quoted value: up to its closing quote
            close = text.find(text[start], start + 1)
            start, end = start + 1, len(text) if close < 0 else close
        else:
            end_match = _VALUE_END.search(text, start)
            end = len(text) if end_match is None else end_match.start()
        if end > start and text[start:end] != REDACTED:
            out.append(text[pos:start] + REDACTED)
            pos = end
    out.append(text[pos:])
    return "".join(out)


def _bare_secret_pair(text: str) -> bool:
    """`password:hunter2`: a one-word secret name before the colon is a pair, not a module."""
    name = text.split(":", 1)[0]
    return "." not in name and len(_words(name)) == 1 and is_secret_name(name)


# Every C0 control character but the tab, and DEL: a newline or a carriage return in a folder's
# name would split or overwrite a printed line, an escape sequence would drive the terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def one_line(text: str) -> str:
    """`text` as one printed line: each control character written as its escape (`\\n`)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text) if text else text


def printed(text: str) -> str:
    """`text` as thrifty prints it: redacted (`redact_text`), then on one line (`one_line`).
    Every line the command line writes itself (errors, `thrifty COMMAND:` progress) goes
    through it; log records go through `redacted_log_records`."""
    return one_line(redact_text(text))


def redact_text(text: str) -> str:
    """The text with URL credentials, signed-URL parameters, AWS key ids and secret-named
    `name=value` pairs replaced by `<redacted>` (a URL's `user:password@` is removed)."""
    if not text:
        return text
    return _redact_plain(_redact_encoded(text))


def _redact_plain(text: str) -> str:
    text = _USERINFO.sub(r"\g<scheme>", text)
    text = _BARE_USERINFO.sub("", text)
    text = _QUERY_PARAM.sub(_redact_query, text)
    text = _AWS_KEY_ID.sub(REDACTED, text)
    text = _BEARER.sub(rf"\1 {REDACTED}", text)
    if _IMPORT_PATH.fullmatch(text) and not _bare_secret_pair(text):
        return text
    return _redact_pairs(text)


# The URL is known to be one: everything up to its last `@` is credentials, quotes and spaces
# included (which the pattern for URLs in free text must stop at).
_URL_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://(?P<info>[^\n]*)@")
_MIN_PIECE = 4  # shorter pieces of a password are not masked alone: they would hit any text


def url_secrets(url: str) -> tuple[str, ...]:
    """What of a URL's `user:password@` a library may quote apart from the URL, longest first:
    the whole, the user, the password, each part of it between `/`, `:` or `@`, and the user
    with the password up to each `/` (an error about the bucket name the library cut at a `/`
    of the password quotes what came before it). Pieces under four characters are masked only
    within a longer one. For `redact_known`."""
    match = _URL_USERINFO.match(url)
    if match is None:
        return ()
    info = match.group("info")
    user, _, password = info.partition(":")
    cuts = [password[: m.start()] for m in re.finditer("/", password)]  # a bucket name's ends
    pieces = {info, user, password, *re.split(r"[/:@]", password), *cuts}
    pieces |= {f"{user}:{cut}" for cut in cuts}
    return tuple(sorted((p for p in pieces if len(p) >= _MIN_PIECE), key=len, reverse=True))


def redact_known(text: str, secrets: tuple[str, ...]) -> str:
    """`redact_text`, with each of `secrets` (`url_secrets`) masked wherever it appears."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return redact_text(text)


# --------------------------------------------------------------------------------------------
# Values


def redact_value(value: Any) -> Any:
    """A copy of `value` (dicts and lists recursed) that is safe to write to disk.

    Strings go through `redact_text`. A key that names a secret (key, secret, token, password,
    credential, session, signature, auth, ...) has its value replaced by `"<redacted>"`
    unless that value is a number, a boolean or None. `storage_options` becomes `{}`: any of
    its keys may hold a credential (s3fs `key`/`secret`/`token`, `client_kwargs`, adlfs
    `connection_string`, gcsfs `token` as a dict), and a placeholder would be handed back to
    the filesystem when a run is started again from its config.toml, failing with a confusing
    authentication error; with `{}` the credentials come from the environment, as they should.
    """
    if isinstance(value, Mapping):
        return {_redact_key(k): _redact_item(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def _redact_key(key: Any) -> Any:
    return _redacted_key(key) if isinstance(key, str) else key


# Keys repeat (every metrics record has the same dozen): each is judged once, not per record.
@functools.lru_cache(maxsize=4096)
def _redacted_key(key: str) -> str:
    return redact_text(key)


@functools.lru_cache(maxsize=4096)
def _secret_key(key: str) -> bool:
    return is_secret_name(key)


def _redact_item(key: Any, value: Any) -> Any:
    if not isinstance(key, str):
        return redact_value(value)
    if key == "storage_options":
        return {}
    if _secret_key(key) and not (value is None or isinstance(value, (bool, int, float))):
        return REDACTED
    if isinstance(value, (int, float)) or value is None:  # bool is an int: nothing to redact
        return value
    return redact_value(value)


# --------------------------------------------------------------------------------------------
# Logging


def redact_record(record: logging.LogRecord) -> None:
    """Redact a record's message (arguments merged in), traceback and stack in place."""
    try:
        message = record.getMessage()
    except Exception:  # arguments that do not fit: logging reports it, never with a secret
        message = f"{record.msg} {record.args}"
    record.msg = redact_text(message)
    record.args = None
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = redact_text(record.exc_text)
    if record.stack_info:
        record.stack_info = redact_text(record.stack_info)


@contextlib.contextmanager
def redacted_log_records() -> Iterator[None]:
    """While inside: every log record made in this process, by any logger, is redacted
    (`redact_record`) as it is made, so that whichever handler prints it (one a command set up,
    logging's last resort, a library's own) prints no secret. The command line runs each
    command inside it; the record factory in place before is restored after."""
    previous = logging.getLogRecordFactory()

    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        redact_record(record)
        return record

    logging.setLogRecordFactory(make)
    try:
        yield
    finally:
        logging.setLogRecordFactory(previous)


class RedactingFilter(logging.Filter):
    """Redacts each record's message (arguments merged in) and traceback before it is written,
    the message kept on one line (`one_line`).

    Install it on handlers, not loggers: a logger's filters skip records that its children
    (`thrifty.checkpointing.store`) pass up, a handler's see every record it writes.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        record.msg = one_line(record.msg)
        return True


def install_log_redaction(*loggers: logging.Logger) -> None:
    """Add a `RedactingFilter` to every handler of the root logger and of `loggers` (default:
    the "thrifty" logger). Call it after logging is configured; calling it again is harmless."""
    targets = [logging.getLogger(), *(loggers or (logging.getLogger("thrifty"),))]
    for logger in targets:
        for handler in logger.handlers:
            if not any(isinstance(f, RedactingFilter) for f in handler.filters):
                handler.addFilter(RedactingFilter())
