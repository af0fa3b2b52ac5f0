"""Every example output of the planner in README.md and docs/*.md is what the code prints.

The test reads the markdown and runs what it shows. Its conventions:

- **Commands.** A fenced block whose lines start `$ thrifty plan`, `$ thrifty prices` or
  `$ thrifty scale` (after optional `NAME=value` environment settings) holds commands and their
  output: each `$ ` line is a command (a line ending in `\\` continues it, and it is split as a
  shell would split it), the lines up to the next `$ ` line are its output, and a last line
  `(exit code N)` says it exits with N (no such line: 0). Each runs in-process through
  `thrifty.cli.main`, in an empty directory, with the built-in catalog and 120 columns. The
  output compared is stdout, and for a command that fails, stderr before it.
- **Python.** A fenced block preceded by `<!-- output-of: python above -->` is what the
  ```python block before it prints, run in a fresh namespace.
- **Exact or excerpt.** Lines compare with their trailing spaces removed (the tables pad
  their cells), and trailing blank lines are ignored; nothing else is normalized. An output
  with a line that is only `...` or `…`, or a `…` inside a line, is an excerpt: every other
  line it shows must appear in the output, in the order shown, where `…` inside a line stands
  for any text.
- **Markers**, an HTML comment on the last non-blank line before the opening fence:
  `<!-- not-run: REASON -->` leaves a block out (output measured on some machine: training
  runs, `thrifty scale`, `thrifty tune`), and the reason must be given; the figures in it that
  come from the planner are checked by the tests at the end of this file.
  `<!-- run-with: FIXTURE -->` writes the files of FIXTURE (in `FIXTURES` below) into the
  directory before the block runs.

When a documented output no longer matches, the failure names the file and line and shows the
difference. `python tests/test_documented_outputs.py --update` rewrites the output of every
exact example in place from what the code prints (excerpts are left to be edited by hand).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import io
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
FAMILY = ("plan", "prices", "scale")
MARKER = re.compile(r"<!--\s*([a-z-]+):\s*(.*?)\s*-->")
KNOWN_MARKERS = ("not-run", "run-with", "output-of")
EXIT_LINE = re.compile(r"\(exit code (\d+)\)")
GAP = ("...", "…")
COLUMNS = 120

# Files a block needs, by the name its `run-with` marker gives.
FIXTURES: dict[str, dict[str, str]] = {
    # the catalog row of docs/planner.md's "Your own prices", with a negative price on line 7
    "malformed-catalog": {
        "my-prices.toml": (
            '[[instance]]\nname = "p4d.24xlarge"\nprovider = "aws"\nregion = "us-west-2"\n'
            'gpu = "A100"\ngpu_count = 8\non_demand = -3\nprice_source = "our negotiated rate"\n'
            'price_date = "2026-12-01"\n'
        )
    },
}


@dataclass(frozen=True)
class Block:
    """A fenced block: its file, the line of its opening fence (1-based), its language, its
    lines and the marker before it (kind, value), if any."""

    path: Path
    line: int
    lang: str
    lines: tuple[str, ...]
    marker: tuple[str, str] | None

    @property
    def where(self) -> str:
        return f"{_shown(self.path)}:{self.line}"


def _shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


@dataclass(frozen=True)
class Command:
    """One documented command: its file and the line of its `$ ` (1-based), what it runs,
    what it prints and exits with."""

    path: Path
    line: int
    text: str
    env: dict[str, str]
    argv: list[str]
    expected: list[str]
    exit_code: int
    fixture: str | None

    @property
    def where(self) -> str:
        return f"{_shown(self.path)}:{self.line}"


def read_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a markdown file, with the marker before each."""
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(```+)(\S*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence.group(1):
            end += 1
        blocks.append(
            Block(path, i + 1, fence.group(2), tuple(lines[i + 1 : end]), _marker(lines, i))
        )
        i = end + 1
    return blocks


def _marker(lines: list[str], fence: int) -> tuple[str, str] | None:
    before = next((line for line in reversed(lines[:fence]) if line.strip()), "")
    found = MARKER.fullmatch(before.strip())
    return (found.group(1), found.group(2)) if found else None


def all_blocks() -> list[Block]:
    return [b for path in DOCUMENTS for b in read_blocks(path)]


def split_command(text: str) -> tuple[dict[str, str], list[str]]:
    """Environment settings and arguments of a shell command line."""
    try:
        words = shlex.split(text)
    except ValueError:  # not a shell line (another tool's prompt): never a planner command
        words = text.split()
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def is_planner(text: str) -> bool:
    _, argv = split_command(text)
    return len(argv) >= 2 and argv[0] == "thrifty" and argv[1] in FAMILY


def commands(block: Block) -> list[Command]:
    """The commands of a block and the output documented after each."""
    found: list[Command] = []
    lines = list(block.lines)
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1
            continue
        start, text = i, lines[i][2:]
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1].rstrip() + " " + lines[i].strip()
        i += 1
        output = []
        while i < len(lines) and not lines[i].startswith("$ "):
            output.append(lines[i].rstrip())
            i += 1
        while output and not output[-1]:
            output.pop()
        code = 0
        if output and (last := EXIT_LINE.fullmatch(output[-1])):
            code = int(last.group(1))
            output.pop()
        env, argv = split_command(text)
        fixture = block.marker[1] if block.marker and block.marker[0] == "run-with" else None
        line = block.line + 1 + start
        found.append(Command(block.path, line, text, env, argv[1:], output, code, fixture))
    return found


def planner_blocks() -> list[Block]:
    """The blocks that show a planner command: run, or marked not-run."""
    return [b for b in all_blocks() if any(is_planner(c.text) for c in commands(b))]


def runnable_commands() -> list[Command]:
    return [
        c
        for b in planner_blocks()
        if not (b.marker and b.marker[0] == "not-run")
        for c in commands(b)
    ]


def python_examples() -> list[tuple[Block, Block]]:
    """(code, output) pairs: an output block marked `output-of: python above` and the python
    block before it."""
    return [pair for path in DOCUMENTS for pair in python_pairs(read_blocks(path))]


def python_pairs(blocks: list[Block]) -> list[tuple[Block, Block]]:
    pairs = []
    for before, block in zip(blocks, blocks[1:], strict=False):
        if block.marker == ("output-of", "python above"):
            assert before.lang == "python", f"{block.where}: no python block before it"
            pairs.append((before, block))
    return pairs


def is_excerpt(expected: list[str]) -> bool:
    return any(line.strip() in GAP or "…" in line for line in expected)


def mismatch(expected: list[str], actual: list[str]) -> str | None:
    """None when `actual` is what `expected` documents, else a description of the difference."""
    actual = [line.rstrip() for line in actual]
    while actual and not actual[-1]:
        actual.pop()
    if not is_excerpt(expected):
        if expected == actual:
            return None
        diff = difflib.unified_diff(expected, actual, "documented", "printed", lineterm="")
        return "\n".join(diff)
    cursor = 0
    for line in expected:
        if line.strip() in GAP:
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in line.split("…")))
        while cursor < len(actual) and not pattern.fullmatch(actual[cursor]):
            cursor += 1
        if cursor == len(actual):
            return f"excerpt line not printed (in this order): {line!r}\nprinted:\n" + "\n".join(
                actual
            )
        cursor += 1
    return None


@contextlib.contextmanager
def _environment(env: dict[str, str], directory: Path) -> Iterator[None]:
    saved = dict(os.environ)
    cwd = Path.cwd()
    for name in ("THRIFTY_CATALOG", "FORCE_COLOR", "FORCE_TERMINAL", "TTY_COMPATIBLE"):
        os.environ.pop(name, None)
    os.environ.update({"COLUMNS": str(COLUMNS), **env})
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)


def run_command(command: Command, directory: Path) -> tuple[int, list[str]]:
    """Run a documented command in-process in `directory`: its exit code and its output."""
    import thrifty.cli

    for name, text in FIXTURES.get(command.fixture or "", {}).items():
        (directory / name).write_text(text, encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    with (
        _environment(command.env, directory),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code = thrifty.cli.main(command.argv)
        except SystemExit as exc:  # argparse's usage errors
            code = int(exc.code or 0)
    text = out.getvalue() if code == 0 else err.getvalue() + out.getvalue()
    return code, text.splitlines()


def run_python(code: Block) -> list[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile("\n".join(code.lines), code.where, "exec"), {"__name__": "__doc_example__"})
    return out.getvalue().splitlines()


@pytest.fixture(autouse=True)
def _commands_that_import() -> Iterator[None]:
    """Leave out a sibling command module that does not import yet, as the planner's own
    tests do: it must not hide the planner's commands."""
    import thrifty.cli

    modules = []
    for name in thrifty.cli.COMMAND_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        modules.append(name)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(thrifty.cli, "COMMAND_MODULES", tuple(modules))
        yield


# ---- the documented examples, run ------------------------------------------------------


@pytest.mark.parametrize("command", runnable_commands(), ids=lambda c: c.where)
def test_a_documented_planner_command_prints_its_documented_output(
    command: Command, tmp_path: Path
) -> None:
    code, printed = run_command(command, tmp_path)
    assert code == command.exit_code, f"{command.where}: exit code {code}\n" + "\n".join(printed)
    problem = mismatch(command.expected, printed)
    assert problem is None, f"{command.where}: $ {command.text}\n{problem}"


@pytest.mark.parametrize(
    ("code", "output"), python_examples(), ids=lambda b: b.where if isinstance(b, Block) else ""
)
def test_a_documented_python_example_prints_its_documented_output(
    code: Block, output: Block
) -> None:
    problem = mismatch([line.rstrip() for line in output.lines], run_python(code))
    assert problem is None, f"{output.where}: the python block at {code.where}\n{problem}"


# ---- the conventions hold ---------------------------------------------------------------


def test_every_planner_example_is_either_run_or_marked_with_why_not() -> None:
    found = planner_blocks()
    assert len(found) >= 15, "the planner's examples were not found: has the layout changed?"
    for block in found:
        if block.marker and block.marker[0] == "not-run":
            assert block.marker[1], f"{block.where}: not-run needs a reason"
    assert len(runnable_commands()) >= 20
    assert python_examples(), "docs/planner.md's Python example is not marked"


def test_every_marker_is_one_the_test_knows() -> None:
    for block in all_blocks():
        if block.marker is None:
            continue
        kind, value = block.marker
        assert kind in KNOWN_MARKERS, f"{block.where}: unknown marker {kind!r}"
        if kind == "run-with":
            assert value in FIXTURES, f"{block.where}: no fixture {value!r}"
        if kind == "output-of":
            assert value == "python above", f"{block.where}: output-of {value!r}"


def test_a_changed_figure_fails_the_comparison() -> None:
    printed = ["Spot economics", "", "  expected cost, spot      $4.47 at $20.20/h   "]
    assert (
        mismatch(["Spot economics", "", "  expected cost, spot      $4.47 at $20.20/h"], printed)
        is None
    )
    assert (
        mismatch(["Spot economics", "", "  expected cost, spot      $3.80 at $20.20/h"], printed)
        is not None
    )
    # an excerpt: its lines in order, `…` for any text; a wrong figure still fails
    assert mismatch(["...", "  expected cost, spot      $4.47 at …"], printed) is None
    assert mismatch(["...", "  expected cost, spot      $3.80 at …"], printed) is not None
    assert mismatch(["  expected cost, spot …", "Spot economics", "…"], printed) is not None


def test_a_command_block_is_read_as_a_shell_reads_it() -> None:
    block = Block(
        ROOT / "README.md",
        1,
        "text",
        (
            "$ OMP_NUM_THREADS=1 thrifty plan --params 7B \\",
            "    --advisor '>20%'",
            "out",
            "(exit code 2)",
            "$ thrifty prices p4d",
            "",
        ),
        None,
    )
    first, second = commands(block)
    assert first.env == {"OMP_NUM_THREADS": "1"}
    assert first.argv == ["plan", "--params", "7B", "--advisor", ">20%"]
    assert (first.expected, first.exit_code) == (["out"], 2)
    assert (second.argv, second.expected, second.exit_code) == (["prices", "p4d"], [], 0)


def test_update_rewrites_a_stale_output_with_what_the_code_prints(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```text\n$ thrifty plan --budget-flops 5.88e23 \\\n    --fit hoffmann\nstale\n```\n\n"
        "```python\nprint(6 * 7)\n```\n\n<!-- output-of: python above -->\n```text\n41\n```\n"
        "```text\n$ thrifty prices p4d\nthrifty: error: stale\n(exit code 2)\n```\n",
        encoding="utf-8",
    )
    assert update((page,)) == 3
    blocks = read_blocks(page)
    (command,) = commands(blocks[0])
    code, printed = run_command(command, tmp_path)
    assert command.expected[0] == "Compute-optimal allocation for 5.88e+23 FLOPs"
    assert mismatch(command.expected, printed) is None
    assert blocks[2].lines == ("42",)
    (error,) = commands(blocks[3])
    assert error.exit_code == 2 and error.expected[0].startswith("thrifty: error: unknown GPU")
    assert update((page,)) == 0


# ---- measured examples: the figures in them that come from the planner -------------------


def _block_starting(prefix: str, path: Path) -> Block:
    found = [b for b in read_blocks(path) if b.lines and b.lines[0].startswith(prefix)]
    assert len(found) == 1, f"{path.name}: {len(found)} blocks start with {prefix!r}"
    return found[0]


def _number(text: str) -> float:
    return float(text.replace(",", "").replace("$", ""))


TUNE_STEPS, TUNE_TOKENS_PER_STEP = 300, 32 * 128  # examples/demo.toml: run.max_steps, batch x block


def tune_example_prices(lines: list[str]) -> tuple[list[str], str, list[str]]:
    """What the planner makes of docs/tune.md's measured `thrifty tune` trials: each trial row
    with its $/M tokens and job $ at the catalog's on-demand price, the spot note, and the
    waterfall's lines (spot lever from the catalog's spot price and the spot model)."""
    from thrifty.config import CostConfig
    from thrifty.console import console
    from thrifty.plan.levers import LeverInputs, LeverPlan, apply_levers
    from thrifty.search.tune.pricing import price_for, spot_plan
    from thrifty.search.tune.report import waterfall_table
    from thrifty.search.tune.waterfall import Waterfall

    price = price_for(CostConfig(), "p4d.24xlarge")
    assert price.on_demand_usd_per_hour is not None
    usd_per_second = price.on_demand_usd_per_hour / 3600
    rows, rates = [], {}
    for line in lines:
        if not re.match(r" 0\d-", line):
            continue
        cells = line.split()
        rate = rates[cells[0]] = _number(cells[-6])
        per_million = f"${usd_per_second * 1e6 / rate:.3f}"
        job = f"${usd_per_second * TUNE_STEPS * TUNE_TOKENS_PER_STEP / rate:.3f}"
        rows.append(_replace_last_two(line, per_million, job))
    base, best = rates["00-baseline"], rates["01-micro"]
    hours = TUNE_STEPS * TUNE_TOKENS_PER_STEP / base / 3600
    spot, note = spot_plan(price, hours, "5-10%")
    assert spot is not None, note
    planned = apply_levers(
        LeverInputs(
            hours_per_run=hours,
            on_demand_per_hour=price.on_demand_usd_per_hour,
            spot_per_hour=spot.spot_per_hour,
            spot_overhead=spot.overhead_factor,
            microbatch_speedup=best / base,
            period="run",
        )
    )
    detail = f"micro-batch 16 x 2 -> 32 x 1: {best / base:.2f}x tokens/s (measured)"
    measured = [
        dataclasses.replace(s, detail=detail) if s.lever == "larger micro-batch" else s
        for s in planned.steps
    ]
    plan = LeverPlan(period="run", baseline=planned.baseline, steps=measured, assumptions=[])
    out = console()
    with out.capture() as captured:
        out.print(waterfall_table(Waterfall(plan, "USD", spot)))
    table = [line.rstrip() for line in captured.get().splitlines() if line.strip()]
    return rows, f"  assumed: {note}", table


def _replace_last_two(line: str, *cells: str) -> str:
    """`line` with its last two cells replaced, right-aligned in the same columns."""
    found = re.fullmatch(r"(.*?)(\s+\S+)(\s+\S+)", line.rstrip())
    assert found, line
    head, *old = found.groups()
    return head + "".join(cell.rjust(len(was)) for cell, was in zip(cells, old, strict=True))


def test_the_tune_example_prices_its_measured_trials_at_the_catalog_and_spot_model() -> None:
    """docs/tune.md's `thrifty tune` example is measured (not run here); its dollars are not."""
    block = _block_starting(
        "$ thrifty tune examples/demo.toml --budget 270s", ROOT / "docs" / "tune.md"
    )
    assert block.marker and block.marker[0] == "not-run"
    lines = list(block.lines)
    rows, note, table = tune_example_prices(lines)
    assert len(rows) == 4
    for row in rows:
        assert row in lines, f"{block.where}: a trial's prices are not the catalog's:\n{row}"
    assert note in lines, f"{block.where}: the spot note is not the planner's:\n{note}"
    start = lines.index(table[0])
    assert lines[start : start + len(table)] == table, "\n".join(table)


def test_the_scale_examples_predict_what_the_planner_predicts_from_their_measurements() -> None:
    """docs/scale.md's runs are measured; its predicted efficiencies are the planner's
    `single_node_efficiency` of the measured step time and bus bandwidth."""
    from thrifty.plan.scaling import single_node_efficiency

    path = ROOT / "docs" / "scale.md"
    checked = 0
    for block in read_blocks(path):
        if not any(is_planner(c.text) for c in commands(block)):
            continue
        assert block.marker and block.marker[0] == "not-run", block.where
        rows = [line.split() for line in block.lines if re.match(r"\s+\d+\s+(single|ddp)", line)]
        if not rows:
            continue
        one = next(r for r in rows if r[0] == "1")
        for row in rows:
            n, seconds = int(row[0]), _number(one[4]) / 1000
            bus = None if row[-1] == "-" else _number(row[-1])
            predicted = single_node_efficiency(35_075, n, seconds, bus)
            assert row[-3] == f"{predicted['no_overlap']:.0%}", (block.where, row)
            assert row[-2] == f"{predicted['overlap']:.0%}", (block.where, row)
            checked += 1
    assert checked == 4


def test_the_scale_python_example_shows_what_the_planner_returns() -> None:
    """docs/scale.md's Python example prints its results as comments (its bandwidth is
    measured); the planner's call among them returns what the comment shows, `...` standing
    for the digits left out."""
    from thrifty.plan.scaling import single_node_efficiency

    (block,) = [b for b in read_blocks(ROOT / "docs" / "scale.md") if b.lang == "python"]
    lines = list(block.lines)
    call = next(i for i, line in enumerate(lines) if line.startswith("single_node_efficiency("))
    shown = lines[call + 1].removeprefix("# ")
    result = eval(lines[call], {"single_node_efficiency": single_node_efficiency})
    pattern = ".*".join(re.escape(part) for part in shown.split("..."))
    assert re.fullmatch(pattern, repr(result)), f"{block.where}: {result!r} is not {shown}"


# ---- regenerate --------------------------------------------------------------------------


def update(paths: tuple[Path, ...] = DOCUMENTS) -> int:
    """Rewrite each exact example's documented output with what the code prints, each run in
    a new empty directory; return how many changed. Excerpts, and commands whose exit code is
    not the documented one, are left alone."""
    changed = 0
    for path in paths:
        text = path.read_text(encoding="utf-8").splitlines()
        edits = []
        blocks = read_blocks(path)
        for block in blocks:
            if block.marker and block.marker[0] == "not-run":
                continue
            for command in commands(block):
                if not is_planner(command.text) or is_excerpt(command.expected):
                    continue
                with tempfile.TemporaryDirectory() as scratch:
                    code, printed = run_command(command, Path(scratch))
                printed = [line.rstrip() for line in printed]
                while printed and not printed[-1]:
                    printed.pop()
                if code != command.exit_code or printed == command.expected:
                    continue
                first = command.line  # the output starts after the command's last line
                while text[first - 1].endswith("\\"):
                    first += 1
                edits.append((first, first + len(command.expected), printed))
        for example, output in python_pairs(blocks):
            printed = run_python(example)
            if printed != [line.rstrip() for line in output.lines]:
                edits.append((output.line, output.line + len(output.lines), printed))
        for start, end, printed in sorted(edits, reverse=True):
            text[start:end] = printed
            changed += 1
        if edits:
            path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return changed


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/test_documented_outputs.py --update")
    print(f"{update()} documented outputs rewritten")
