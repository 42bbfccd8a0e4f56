"""bench/result_schema.py: every result file follows the schema; the writer writes it; old files migrate."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench import common
from bench.migrate_results_v1 import migrate
from bench.result_schema import SCHEMA_VERSION, ResultFileError, problems, read_result

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
ENVIRONMENT = {
    "timestamp": "2026-12-07T10:00:00+00:00",
    "git_commit": "abc1234",
    "machine": {},
    "versions": {},
}


def test_every_result_file_follows_the_schema() -> None:
    files = sorted(RESULTS.glob("*.json"))
    assert files, "bench/results/ holds no result file"
    found = {path.name: problems(json.loads(path.read_text(encoding="utf-8")), path.stem) for path in files}
    invalid = {name: found for name, found in found.items() if found}
    assert not invalid, (
        f"result files off the schema (python -m bench.migrate_results_v1 migrates): {invalid}"
    )


def test_the_writer_records_the_envelope_and_the_command_that_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", [str(Path(common.__file__).with_name("latency.py")), "--threads", "2"])
    path = common.write_result("latency_x", {"settings": {"threads": 2}, "p50_ms": 3.5}, tmp_path)
    document = read_result(path)
    assert document["schema_version"] == SCHEMA_VERSION
    assert document["command"] == "python -m bench.latency --threads 2"
    assert document["settings"] == {"threads": 2} and document["p50_ms"] == 3.5
    assert document["environment"]["machine"]["usable_cores"] >= 1


def test_the_writer_refuses_a_result_off_the_schema(tmp_path: Path) -> None:
    with pytest.raises(ResultFileError, match="settings"):
        common.write_result("bad", {"command": "python -m bench.x", "settings": [1, 2]}, tmp_path)
    assert not list(tmp_path.iterdir())


def test_the_reader_refuses_another_version_and_a_misnamed_file(tmp_path: Path) -> None:
    body = {"name": "other", "command": "c", "environment": ENVIRONMENT, "settings": {}}
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1, **body}))
    with pytest.raises(ResultFileError, match="schema_version") as refused:
        read_result(tmp_path / "run.json")
    assert "not the file's name" in str(refused.value)


def test_an_old_file_migrates_with_its_command_as_a_module_and_its_measurements_untouched() -> None:
    old = {"name": "scaling_surface_nano_10min", "environment": ENVIRONMENT, "final": {"mAP50": 0.9}}
    recorded = migrate(old["name"], {**old, "command": "python bench/scaling.py --rung surface:nano:10"})
    assert problems(recorded, old["name"]) == []
    assert recorded["command"] == "python -m bench.scaling --rung surface:nano:10"
    assert "command_derived" not in recorded and recorded["final"] == {"mAP50": 0.9}
    derived = migrate(
        "train_deeppcb_x", {**old, "name": "train_deeppcb_x", "minutes": 20.0, "preset": "nano"}
    )
    assert derived["command"] == "python -m bench.train_deeppcb --preset nano --minutes 20"
    assert derived["command_derived"] is True and derived["settings"] == {}
