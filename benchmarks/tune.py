"""`thrifty tune` on the demo, with its trials in one warm worker and, side by side in the same
run, with a new process for every trial (as trials ran before the warm engine): the time tune
needs to decide every lever it tries, its table, its paired comparisons, and its winner
re-measured against the config as given.

Each arm runs `python -m thrifty tune examples/demo.toml` (the demo's own config: a byte-level
GPT, micro-batch 16 x 2 = effective batch 32, precision and num_workers auto) in a child
process, its report printed as it comes; the cold arm sets THRIFTY_COLD_TRIALS=1, which starts
a new worker for every trial (`thrifty.search.engine`). The budget is large enough that neither
arm is cut short, so each arm's wall time is the time it needed to decide. Then from each
tune.json: the trials, those not reached, the winner, and the final paired comparison (the
winner against the config as given in alternating runs: ratio, 90% interval, rounds,
decision), and the seconds its trials and its comparisons' runs took: decisions the machine's
noise sways can differ between the arms, and so can the runs they need, while the seconds a
trial and a run take compare whatever was decided. The goal: the warm arm decides in half the cold arm's time or less, and its winner
is never below 0.97x the config as given. The job is priced on the case study's instance family,
p4d.24xlarge (--instance none: unpriced), so the waterfall has the planner's spot lever; on a
CPU those dollars only illustrate. Not a test: the figures depend on the machine.

    python benchmarks/tune.py [--budget 900s] [--steps 20] [--arms cold,warm] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="900s", help="each tune's --budget (default 900s)")
    parser.add_argument("--steps", type=int, default=20, help="steps per trial (default 20)")
    parser.add_argument("--arms", default="cold,warm", help="cold, warm or both (the default)")
    parser.add_argument(
        "--instance",
        default="p4d.24xlarge",
        help="the catalog instance to price the job on (default p4d.24xlarge; none: unpriced)",
    )
    parser.add_argument("--out", help="where the tunes write (default: a temporary folder)")
    args = parser.parse_args(argv)
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="thrifty-tune-"))
    results = {}
    for arm in args.arms.split(","):
        out = root / arm
        command = [sys.executable, "-m", "thrifty", "tune", str(ROOT / "examples" / "demo.toml")]
        command += ["--budget", args.budget, "--steps", str(args.steps), "--out", str(out)]
        if args.instance != "none":
            command += ["--instance", args.instance]
        env = {**os.environ, "THRIFTY_COLD_TRIALS": "1" if arm == "cold" else "0"}
        print(f"\n== {arm}: $ " + " ".join(command[2:]), flush=True)
        started = time.monotonic()
        code = subprocess.run(command, cwd=ROOT, env=env).returncode
        wall = time.monotonic() - started
        try:
            report = json.loads((out / "tune.json").read_text())
        except (OSError, ValueError) as exc:
            print(f"no tune.json in {out}: {exc} (exit code {code})", file=sys.stderr)
            return 1
        results[arm] = (wall, report)
    print()
    for arm, (wall, report) in results.items():
        trials = [t["wall_seconds"] for t in report["trials"]]
        runs = [r["wall_seconds"] for c in report["comparisons"] for r in c.get("blocks", [])]
        print(
            f"{arm:<5} decided in {wall:6.1f} s (whole command): {len(trials)} trial(s) in "
            f"{sum(trials):.1f} s ({_median(trials):.1f} s median), {len(runs)} paired run(s) in "
            f"{sum(runs):.1f} s ({_median(runs):.1f} s median), "
            f"{len(report['not_reached'])} not reached, winner {report['winner']}"
        )
        print(f"      {remeasured(report)}")
    if {"cold", "warm"} <= results.keys():
        ratio = results["warm"][0] / results["cold"][0]
        print(f"time to decide, warm / cold: {ratio:.2f} (goal: 0.50 or less)")
    return 0


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] if values else 0.0


def remeasured(report: dict) -> str:
    """The winner against the config as given, as the paired comparison of the two measured
    it: the final one, or for a winner one lever away, the comparison that kept it (against
    the config as given itself)."""
    unit = report["unit"]
    comparisons = report["comparisons"]
    final = next((c for c in comparisons if c["stage"] == "final"), None)
    if final is None:
        given = report["trials"][0]["name"] if report["trials"] else None
        final = next(
            (
                c
                for c in comparisons
                if (c["candidate"], c["incumbent"]) == (report["winner"], given)
            ),
            None,
        )
    if final is None:
        lines = [f"paired: {c['line']}" for c in comparisons]
        return "\n".join([*lines, f"winner {report['winner']}: the config as given"])
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
