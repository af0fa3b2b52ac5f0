"""`thrifty tune` on the demo: its table, its paired comparisons, its waterfall, and the winner
re-measured against the config as given, in one run that must finish within 5 minutes.

It runs `python -m thrifty tune examples/demo.toml` (the demo's own config: a byte-level GPT,
micro-batch 16 x 2 = effective batch 32, precision and num_workers auto) in a child process,
its report printed as it comes, then reads from the tune's tune.json the final paired
comparison (the winner against the config as given in alternating runs: ratio, 90% interval,
rounds, decision) and checks the wall time of the whole command against the limit. The budget leaves the command's start-up
and the report inside the limit. The job is priced on the case study's instance family,
p4d.24xlarge (--instance none: unpriced), so the waterfall has the planner's spot lever; on a
CPU those dollars only illustrate. Not a test: the figures depend on the machine.

    python benchmarks/tune.py [--budget 270s] [--steps 20] [--instance NAME|none] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT_SECONDS = 300.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="270s", help="the tune's --budget (default 270s)")
    parser.add_argument("--steps", type=int, default=20, help="steps per trial (default 20)")
    parser.add_argument(
        "--instance",
        default="p4d.24xlarge",
        help="the catalog instance to price the job on (default p4d.24xlarge; none: unpriced)",
    )
    parser.add_argument("--out", help="where the tune writes (default: a temporary folder)")
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="thrifty-tune-")) / "tune"
    command = [sys.executable, "-m", "thrifty", "tune", str(ROOT / "examples" / "demo.toml")]
    command += ["--budget", args.budget, "--steps", str(args.steps), "--out", str(out)]
    if args.instance != "none":
        command += ["--instance", args.instance]
    print("$ " + " ".join(command[2:]), flush=True)
    started = time.monotonic()
    code = subprocess.run(command, cwd=ROOT).returncode
    wall = time.monotonic() - started
    try:
        report = json.loads((out / "tune.json").read_text())
    except (OSError, ValueError) as exc:
        print(f"no tune.json in {out}: {exc}", file=sys.stderr)
        return 1
    print()
    print(remeasured(report))
    within = wall <= LIMIT_SECONDS
    print(
        f"wall time of the whole command: {wall:.0f} s of the {LIMIT_SECONDS:.0f} s limit "
        f"({'within' if within else 'OVER'}); {len(report['trials'])} trial(s), "
        f"{len(report['not_reached'])} not reached; output in {out}"
    )
    return code or (0 if within else 1)


def remeasured(report: dict) -> str:
    """The winner against the config as given, as the final paired comparison measured it."""
    unit = report["unit"]
    final = next((c for c in report["comparisons"] if c["stage"] == "final"), None)
    if final is None:
        lines = [f"paired: {c['line']}" for c in report["comparisons"]]
        return "\n".join([*lines, f"winner {report['winner']}: not re-measured (no lever kept)"])
    if final["ratio"] is None:
        return f"winner {report['winner']}: {final['line']}"
    return (
        f"{final['candidate']} re-measured against the config as given ({final['incumbent']}), "
        f"{unit}/s: {final['ratio']:.2f}x ({final['low']:.2f}-{final['high']:.2f}, "
        f"{final['confidence']:.0%} interval) over {final['rounds']} alternating rounds: "
        f"{final['decision']}; winner {report['winner']}"
    )


if __name__ == "__main__":
    sys.exit(main())
