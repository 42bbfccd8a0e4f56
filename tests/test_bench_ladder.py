"""bench/scaling.py: which result files make the budget ladder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import scaling


def _write(folder: Path, name: str, **fields) -> None:
    environment = {
        "timestamp": "2026-12-07T10:00:00+00:00",
        "git_commit": "abc1234",
        "machine": {},
        "versions": {},
    }
    envelope = {
        "schema_version": 1,
        "name": name,
        "command": "python -m bench.scaling",
        "environment": environment,
    }
    body = {**envelope, "final": {"mAP50": fields.pop("mAP50")}, "curve": [], "settings": {}, **fields}
    (folder / f"{name}.json").write_text(json.dumps(body))


def test_a_pretrained_arm_fills_a_rung_without_its_own_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scaling, "RESULTS_DIR", tmp_path)
    rung = {"dataset": "surface", "preset": "tiny", "minutes": 60}
    _write(tmp_path, "scaling_surface_tiny_60min", mAP50=0.81, **rung)
    ten = {"dataset": "surface", "preset": "tiny", "init": "pretrained", "settings": {"time_minutes": 10}}
    _write(tmp_path, "pretrained_surface_tiny_pretrained_10min", mAP50=0.78, **ten)
    # the same budget as a rung: the rung's own file wins
    sixty = {**ten, "settings": {"time_minutes": 60}}
    _write(tmp_path, "pretrained_surface_tiny_pretrained_60min", mAP50=0.5, **sixty)
    # template weights do not ship: that arm is not the product's default run
    template = {**ten, "dataset": "deeppcb_template", "preset": "nano"}
    _write(tmp_path, "pretrained_deeppcb_template_pretrained_10min", mAP50=0.97, **template)
    _write(tmp_path, "pretrained_surface_tiny_scratch_10min", mAP50=0.6, **{**ten, "init": "scratch"})
    runs = {(r["dataset"], r["preset"], r["minutes"]): r["final"]["mAP50"] for r in scaling.ladder_runs()}
    assert runs == {("surface", "tiny", 60): 0.81, ("surface", "tiny", 10.0): 0.78}
    trend = scaling.rises_with_budget(
        [{"dataset": d, "preset": p, "minutes": m, "mAP50": v} for (d, p, m), v in runs.items()]
    )
    assert trend["surface:tiny"]["rises"] is True and trend["surface:tiny"]["minutes"] == [10.0, 60]


def test_the_template_rung_uses_the_template_default() -> None:
    rungs = scaling.rungs(["tiny"])
    assert ("deeppcb_template", "nano", 10) in rungs and ("surface", "tiny", 30) in rungs
    assert [minutes for _, _, minutes in rungs] == sorted(minutes for _, _, minutes in rungs)
