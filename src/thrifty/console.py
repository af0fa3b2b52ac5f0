"""What the commands share: the usage exit code, progress lines, their `--set`, `--out`,
`--overwrite` and `--json` options, the call that hands their options on, their `--out` folder,
and the way they print tables and JSON.

Cheap to import: `thrifty --help` loads it with every command (rich is imported when a table
is made).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from thrifty.errors import ThriftyError, command_line_words

if TYPE_CHECKING:
    import argparse

    from rich.console import Console
    from rich.table import Table as RichTable

T = TypeVar("T")

EXIT_USAGE = 2  # bad input: the command printed one line naming the problem and the fix
JSON_HELP = "print the report as JSON"
SET_HELP = "override a config value, e.g. --set batch.micro=8 (repeatable)"


def say(command: str, message: str | BaseException) -> None:
    """One progress line on stderr, `thrifty COMMAND: message`, redacted and on one line
    (`printed`), its fixes (`thrifty.errors.fix`) worded as the command's flags; stdout is
    kept for the report. `message` may be an error the command ends on."""
    from thrifty.redact import printed

    line = printed(command_line_words(message))
    print(f"thrifty {command}: {line}", file=sys.stderr, flush=True)


def dash(value: Any) -> str:
    """A table cell: `-` for a value that is missing; a text on one line (`one_line`), shown
    as written: a folder named `runs/a[/]b` is not rich markup."""
    if value is None:
        return "-"
    from rich.markup import escape

    from thrifty.redact import one_line

    return escape(one_line(str(value)))


def add_set_option(parser: argparse.ArgumentParser) -> None:
    """The repeatable `--set section.key=value` every command that reads a config takes."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help=SET_HELP,
    )


def add_config_options(
    parser: argparse.ArgumentParser, *, nargs: str | None = None, help: str | None = None
) -> None:
    """The CONFIG.toml a command reads (`nargs="?"` and its `help` where it may be left out)
    and the `--set` items applied over it. The config is positional: where among the options
    it is added changes neither the help nor the parsing."""
    parser.add_argument("config", metavar="CONFIG.toml", nargs=nargs, help=help)
    add_set_option(parser)


def add_output_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    out: str | None = None,
    out_metavar: str = "DIR",
    overwrite: str | None = None,
    json: bool | str = False,
) -> None:
    """Add the output options a command takes, in this order, each with that command's help:
    `--out` (a folder, or with `out_metavar="FILE"` one file; `out` says what goes there and the
    default), `--overwrite` (`overwrite` says what it may replace) and `--json` (True: "print
    the report as JSON", or the help to give). An option left at None or False is not added."""
    if out is not None:
        parser.add_argument("--out", metavar=out_metavar, help=out)
    if overwrite is not None:
        parser.add_argument("--overwrite", action="store_true", help=overwrite)
    if json:
        parser.add_argument("--json", action="store_true", help=JSON_HELP if json is True else json)


def call_with_options(
    function: Callable[..., T], args: argparse.Namespace, /, *positional: Any, **given: Any
) -> T:
    """`function(*positional, **given)` (or a class's, a keyword-only dataclass's fields), with
    each of its other keyword-only parameters set to the command's option of the same name
    (`budget=args.budget`); a parameter the command has no option for keeps its default."""
    import inspect

    options = {
        name: getattr(args, name)
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
        and name not in given
        and hasattr(args, name)
    }
    return function(*positional, **options, **given)


def refuse_file(out: Path) -> None:
    """`--out` must be a folder (or not exist yet)."""
    if out.exists() and not out.is_dir():
        raise ThriftyError(f"--out {out} is a file: give a directory")


def prepare_out(out: Path, replace: Iterable[Path] = ()) -> None:
    """Create `--out`, once `replace` (what an earlier run of the same command left in it, the
    command has checked) is deleted."""
    for path in replace:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ThriftyError(f"cannot create --out {out}: {exc.strerror}") from exc


# --- tables and JSON ----------------------------------------------------------------------------


def console() -> Console:
    """Where the commands print their tables."""
    from rich.console import Console

    # Off a terminal (pipes, files, tests) rich would assume 80 columns; the tables need more.
    return Console(width=None if Console().is_terminal else 120, highlight=False)


def Table(**kwargs: Any) -> RichTable:  # noqa: N802 - stands in for rich's class
    """A rich table in the commands' style: light rules, title on the left."""
    from rich import box
    from rich.table import Table as RichTable

    return RichTable(box=box.SIMPLE_HEAD, title_justify="left", title_style="bold", **kwargs)


def json_ready(value: Any) -> Any:
    """A copy of `value` that JSON can hold: it has no NaN or infinity, so those become null;
    mappings get string keys and tuples become lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def to_json(data: Any) -> str:
    """JSON with non-finite floats as null."""
    return json.dumps(json_ready(data), indent=2)
