"""bench/suites.py and `python -m bench`: every benchmark is one command, and the runner runs a suite's commands."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import __main__ as runner
from bench.suites import NOT_BENCHMARKS, ON_REQUEST, SUITES, Step, Suite

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def test_every_benchmark_is_in_a_suite_or_has_its_command() -> None:
    in_suites = {step.module.removeprefix("bench.") for suite in SUITES.values() for step in suite.steps}
    modules = {path.stem for path in BENCH.glob("*.py")} - set(NOT_BENCHMARKS)
    assert not modules - in_suites - set(ON_REQUEST), "benchmarks no suite runs and ON_REQUEST does not name"
    assert not (set(ON_REQUEST) | in_suites) - modules - {"defectdet.cli"}, (
        "suites name benchmarks that do not exist"
    )


def test_every_step_runs_an_existing_module_with_options_it_has() -> None:
    for suite in SUITES.values():
        for step in suite.steps:
            if step.module == "defectdet.cli":
                continue
            source = (BENCH / f"{step.module.removeprefix('bench.')}.py").read_text(encoding="utf-8")
            for flag in (arg for arg in step.args if arg.startswith("--")):
                assert f'"{flag}"' in source, f"{suite.name}: {step.command} ({flag} is not an option)"


def test_make_bench_runs_the_standard_suite() -> None:
    target = re.search(r"^bench: .*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert target and target.group(1).strip() == "$(BIN)/python -m bench run --suite standard"


def test_the_listing_names_every_suite_command_and_its_minutes(capsys: pytest.CaptureFixture[str]) -> None:
    assert runner.main([]) == 0
    listing = capsys.readouterr().out
    for suite in SUITES.values():
        assert f"{suite.name} (about " in listing
        assert all(f"    {step.command}    # ~" in listing for step in suite.steps)
    assert all(command in listing for command in ON_REQUEST.values())


def test_a_dry_run_prints_the_commands_and_runs_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: pytest.fail("a dry run ran a command"))
    assert runner.main(["run", "--suite", "service", "--dry-run"]) == 0
    assert "[3/6] python -m bench.drift --bundle runs/bench_deeppcb/model.onnx" in capsys.readouterr().out


def test_a_run_stops_at_the_first_failure_and_sends_results_to_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second step fails after printing the results folder it was given; the third never runs."""
    probe = "import os, sys; print(os.environ['BENCH_RESULTS_DIR']); sys.exit(3)"
    suite = Suite("probe", "", (Step("bench.suites"), Step("failing"), Step("never")))
    original = subprocess.run

    def instead(command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        if command[2] == "failing":
            command = [sys.executable, "-c", probe]
        return original(command, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess, "run", instead)
    assert runner.run(suite, tmp_path, dry_run=False, keep_going=False) == 1
    out = capsys.readouterr()
    assert "exit 0" in out.out and str(tmp_path) in out.out and "exit 3" in out.out
    assert "never" not in out.out and "python -m failing" in out.err


def test_the_results_folder_of_a_smoke_run_reaches_the_writer(tmp_path: Path) -> None:
    code = "from bench.common import RESULTS_DIR; print(RESULTS_DIR)"
    env = {**os.environ, "BENCH_RESULTS_DIR": str(tmp_path)}
    printed = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert printed.stdout.strip() == str(tmp_path)
