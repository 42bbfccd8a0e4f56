"""`defectdet demo` end to end with a tiny budget: every artefact it promises is written."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from defectdet.demo import run_demo


def test_demo_runs_the_whole_lifecycle(tmp_path: Path) -> None:
    console = Console(record=True, width=120)
    metrics = run_demo(tmp_path, minutes=0.15, boards=6, console=console)
    for artefact in ("data/data.yaml", "batch.png", "run/best.pt", "run/metrics.csv", "run/report.html",
                     "run/val/report.html", "run/val/metrics.json"):  # fmt: skip
        assert (tmp_path / artefact).is_file(), artefact
    headline = metrics["headline"]
    assert 0.0 <= headline["mAP50"] <= 1.0
    assert 0.0 <= headline["false_call_rate"] <= 1.0  # templates were scored as clean boards
    assert 0.0 <= headline["escape_rate"] <= 1.0  # the held-out boards have defects
    deploy = metrics["deploy"]
    assert (tmp_path / "model.onnx").is_file() and deploy["boards"] >= 1
    assert 0 <= deploy["escaped"] <= deploy["defective_boards"] <= deploy["boards"]
    assert len(list((tmp_path / "predictions").glob("*.png"))) == min(6, deploy["boards"])
    output = console.export_text()
    assert "mAP@0.5" in output and "report" in output and "false-call rate" in output
    assert "Predictor (onnxruntime, no torch)" in output
