"""The benchmark runner: `python -m bench` lists the suites, `python -m bench run --suite NAME` runs one.

python -m bench                          # every suite: its commands and rough minutes; then the rest
python -m bench run --suite quick        # a smoke run, no dataset (about 4 minutes on 2 cores)
python -m bench run --suite service --dry-run
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.suites import ON_REQUEST, SUITES, Suite

ROOT = Path(__file__).resolve().parents[1]


def describe() -> str:
    """Each suite with what it measures, its commands and their rough minutes; then the on-request commands."""
    lines = []
    for suite in SUITES.values():
        lines += [f"{suite.name} (about {_duration(suite.minutes)}): {suite.about}"]
        lines += [f"    {step.command}    # ~{_duration(step.minutes)}" for step in suite.steps]
        lines.append("")
    lines.append("On request (an input of yours, a GPU or a long one-off):")
    lines += [f"    {command}" for command in ON_REQUEST.values()]
    return "\n".join(lines)


def _duration(minutes: float) -> str:
    return f"{minutes / 60:.1f} h" if minutes >= 90 else f"{max(1, round(minutes))} min"


def run(suite: Suite, results_dir: Path | None, dry_run: bool, keep_going: bool) -> int:
    """Run the suite's steps in order from the repository root; stop at the first failure unless keep_going."""
    env = dict(os.environ)
    results_dir = results_dir or (ROOT / suite.results_dir if suite.results_dir else None)
    if results_dir is not None:
        env["BENCH_RESULTS_DIR"] = str(results_dir.resolve())
        print(f"result files go to {results_dir}")
    failed = []
    for index, step in enumerate(suite.steps, 1):
        print(f"[{index}/{len(suite.steps)}] {step.command}    # ~{_duration(step.minutes)}", flush=True)
        if dry_run:
            continue
        started = time.monotonic()
        code = subprocess.run([sys.executable, "-m", step.module, *step.args], cwd=ROOT, env=env).returncode
        print(f"    exit {code} after {(time.monotonic() - started) / 60:.1f} min", flush=True)
        if code:
            failed.append(step.command)
            if not keep_going:
                break
    if failed:
        print("failed:\n" + "\n".join(f"    {command}" for command in failed), file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="action")
    commands.add_parser("list", help="the suites and their commands (the default)")
    runner = commands.add_parser("run", help="run one suite")
    runner.add_argument("--suite", required=True, choices=sorted(SUITES))
    runner.add_argument("--results-dir", type=Path, help="write the result files here instead")
    runner.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    runner.add_argument("--keep-going", action="store_true", help="run the next step after a failure")
    args = parser.parse_args(argv)
    if args.action != "run":
        print(describe())
        return 0
    return run(SUITES[args.suite], args.results_dir, args.dry_run, args.keep_going)


if __name__ == "__main__":
    sys.exit(main())
