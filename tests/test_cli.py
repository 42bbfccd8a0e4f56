"""The command line end to end on a tiny synthesized dataset: synth -> check -> train -> val."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from defectdet.cli import app

runner = CliRunner()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "defectdet.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    result = runner.invoke(
        app, ["synth", str(out), "--boards", "8", "--min-size", "160", "--max-size", "192"]
    )
    assert result.exit_code == 0, result.output
    return out / "data.yaml"


@pytest.fixture(scope="module")
def trained_run(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("run")
    result = runner.invoke(
        app,
        [
            "train", str(tiny_data), "--epochs", "3", "--input-size", "192", "--crop", "0", "--batch", "2",
            "--workers", "0", "--out", str(run), "--set", "progress=false", "--set", "warmup_steps=2",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return run


def test_check_passes_clean_data_and_fails_on_bad_labels(tiny_data: Path, tmp_path: Path) -> None:
    assert runner.invoke(app, ["check", str(tiny_data)]).exit_code == 0
    copy = tmp_path / "copy"
    shutil.copytree(tiny_data.parent, copy)
    label = sorted((copy / "labels" / "train").glob("*.txt"))[0]
    label.write_text(label.read_text() + "99 0.5 0.5 0.1 0.1\n")
    result = runner.invoke(app, ["check", str(copy / "data.yaml")])
    assert result.exit_code == 1
    assert label.name in result.output and "99" in result.output


def test_user_errors_are_one_line_without_traceback(tiny_data: Path) -> None:
    unknown_key = _cli("train", str(tiny_data), "--set", "ema_decayy=0.9")
    assert unknown_key.returncode == 2
    assert "ema_decayy" in unknown_key.stderr and "ema_decay" in unknown_key.stderr
    assert "Traceback" not in unknown_key.stderr + unknown_key.stdout
    missing = _cli("check", "/nonexistent/data.yaml")
    assert missing.returncode != 0 and "Traceback" not in missing.stderr + missing.stdout


def test_train_writes_the_run_folder(trained_run: Path) -> None:
    for name in ("last.pt", "best.pt", "config.yaml", "metrics.csv", "report.html", "pr_curve.png"):
        assert (trained_run / name).is_file(), name
    rows = (trained_run / "metrics.csv").read_text().splitlines()
    assert len(rows) == 4  # header + one row per epoch


def test_val_writes_both_protocols_and_clean_board_rates(
    trained_run: Path, tiny_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "val"
    args = ["val", str(trained_run / "best.pt"), str(tiny_data), "--clean-templates", "--protocol", "both"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0.0 <= metrics["coco"]["mAP50"] <= 1.0 and 0.0 <= metrics["deeppcb"]["mAP"] <= 1.0
    assert 0.0 <= metrics["headline"]["false_call_rate"] <= 1.0  # the templates were added as clean boards
    assert set(metrics["timing"]["ms_per_image"]) >= {"decode", "preprocess", "model", "postprocess"}
    result_files = sorted((out / "deeppcb_results").glob("*.txt"))
    assert len(result_files) >= 2
    assert (out / "report.html").read_text().count("data:image/png;base64") >= 3


def test_val_prints_figures_in_words_into_one_folder_per_run(
    trained_run: Path, tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --out, the best.pt of two runs land in runs/val/<run folder>-best, never one shared folder; the
    table names its figures in words, without raw keys or DeepPCB's figures on data that is not DeepPCB."""
    monkeypatch.chdir(tmp_path)
    other_run = tmp_path / "line4"
    other_run.mkdir()
    shutil.copy(trained_run / "best.pt", other_run / "best.pt")
    for run in (trained_run, other_run):
        result = runner.invoke(app, ["val", str(run / "best.pt"), str(tiny_data)])
        assert result.exit_code == 0, result.output
        folder = Path("runs/val") / f"{run.name}-best"
        assert (folder / "report.html").is_file() and f"report: {folder / 'report.html'}" in result.output
        assert "mAP@0.5" in result.output and "false calls" in result.output and "escapes" in result.output
        assert not [key for key in ("mAP50", "deeppcb", "DeepPCB", "escape_rate") if key in result.output]
    assert sorted(path.name for path in Path("runs/val").iterdir()) == sorted(
        [f"{trained_run.name}-best", "line4-best"]
    )


def test_val_rejects_a_dataset_with_other_classes(trained_run: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    runner.invoke(app, ["synth", str(other), "--boards", "2", "--min-size", "96", "--max-size", "96"])
    data = other / "data.yaml"
    spec = yaml.safe_load(data.read_text())
    spec["names"] = [*spec["names"], "extra"]
    data.write_text(yaml.safe_dump(spec))
    result = _cli("val", str(trained_run / "best.pt"), str(data), "--out", str(tmp_path / "val"))
    assert result.returncode == 2 and "classes" in result.stderr and "Traceback" not in result.stderr


def _write_deeppcb_root(root: Path) -> None:
    """A DeepPCB-layout dataset (groupG/G/ID_test.jpg + _temp.jpg, G_not/ID.txt) from synthetic boards."""
    import cv2

    from defectdet.data.synth import generate_board

    lists: dict[str, list[str]] = {"trainval": [], "test": []}
    for index in range(8):
        group = "10000" if index < 4 else "20000"
        board = generate_board(seed=3, index=index, min_size=192, max_size=192)
        image_id = f"{group}{index:03d}"
        (root / f"group{group}" / group).mkdir(parents=True, exist_ok=True)
        (root / f"group{group}" / f"{group}_not").mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(root / f"group{group}" / group / f"{image_id}_test.jpg"), board.image)
        cv2.imwrite(str(root / f"group{group}" / group / f"{image_id}_temp.jpg"), board.template)
        keep = board.classes < 6  # DeepPCB has no missing-hole class
        rows = [f"{int(x1)},{int(y1)},{int(x2)},{int(y2)},{c + 1}" for (x1, y1, x2, y2), c in
                zip(board.boxes[keep], board.classes[keep], strict=True)]  # fmt: skip
        (root / f"group{group}" / f"{group}_not" / f"{image_id}.txt").write_text("\n".join(rows))
        line = f"group{group}/{group}/{image_id}.jpg group{group}/{group}_not/{image_id}.txt"
        lists["trainval"].append(line)
        if group == "20000":
            lists["test"].append(line)
    for name, lines in lists.items():
        (root / f"{name}.txt").write_text("\n".join(lines))  # DeepPCB's last line has no newline


def test_val_on_a_deeppcb_list_file_writes_result_files(tmp_path: Path) -> None:
    root = tmp_path / "deeppcb"
    _write_deeppcb_root(root)
    run = tmp_path / "run"
    trained = runner.invoke(
        app,
        ["train", str(root), "--epochs", "1", "--input-size", "192", "--crop", "0", "--batch", "2", "--workers", "0",
         "--out", str(run), "--set", "progress=false"],
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output
    out = tmp_path / "val"
    result = runner.invoke(
        app, ["val", str(run / "best.pt"), str(root / "test.txt"), "--split", "test", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert "coco" in metrics and "deeppcb" in metrics
    result_files = sorted((out / "deeppcb_results").glob("*.txt"))
    assert [f.stem for f in result_files] == [f"20000{i:03d}" for i in range(4, 8)]
    for line in result_files[0].read_text().splitlines():
        x1, y1, x2, y2, confidence, kind = line.split(",")
        assert kind in {"open", "short", "mousebite", "spur", "copper", "pin-hole"}
        assert 0 <= float(confidence) <= 1 and int(x1) <= int(x2) and int(y1) <= int(y2)


def test_package_exports_the_python_api_lazily() -> None:
    import defectdet

    for name in defectdet.__all__:
        assert getattr(defectdet, name) is not None, name
    with pytest.raises(AttributeError):
        defectdet.no_such_thing  # noqa: B018


def _coco_folder(root: Path) -> Path:
    """A COCO dataset folder as many tools write it: train.json, val.json and images/."""
    import cv2
    import numpy as np

    (root / "images").mkdir(parents=True)
    for index, split in enumerate(("train", "val")):
        cv2.imwrite(str(root / "images" / f"{split}.png"), np.full((60, 80), 40 * index + 20, np.uint8))
        document = {
            "images": [{"id": 1, "file_name": f"{split}.png", "width": 80, "height": 60}],
            "categories": [{"id": 1, "name": "short"}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 5, 20, 10]}],
        }
        (root / f"{split}.json").write_text(json.dumps(document))
    return root


def test_check_detects_a_coco_folder(tmp_path: Path) -> None:
    result = runner.invoke(app, ["check", str(_coco_folder(tmp_path / "coco"))])
    assert result.exit_code == 0, result.output
    assert "(coco)" in result.output and "OK" in result.output


class _Stop(Exception):
    """Raised by a stand-in once it has seen the arguments the command passed."""


@pytest.mark.parametrize("command", ["check", "train", "val", "doctor loader", "doctor nan"])
def test_every_command_that_takes_data_has_a_format_option(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--format` reaches the dataset reader for every command with a DATA argument."""
    import defectdet.data.check
    import defectdet.diagnostics.loader_doctor
    import defectdet.diagnostics.sources
    import defectdet.engine.trainer
    import defectdet.engine.validate

    seen: dict[str, object] = {}

    def record(name: str):
        def stand_in(*args, **kwargs):
            # train: a TrainConfig; val, loader and nan: their settings; check: keywords
            config = args[0] if name == "train" else args[-1] if name in ("val", "loader", "nan") else kwargs
            seen["format"] = (
                config.get("format") if isinstance(config, dict) else getattr(config, "format", None)
            )
            raise _Stop

        return stand_in

    data = _coco_folder(tmp_path / "coco")
    monkeypatch.setattr(defectdet.data.check, "run_check", record("check"))
    monkeypatch.setattr(defectdet.engine.trainer, "build_train_data", record("train"))
    monkeypatch.setattr(defectdet.engine.validate, "validate", record("val"))
    monkeypatch.setattr(defectdet.diagnostics.loader_doctor, "loader_report", record("loader"))
    monkeypatch.setattr(defectdet.diagnostics.sources, "checkpoint_nan_report", record("nan"))
    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(b"unused")
    args = {"val": [str(checkpoint), str(data)], "doctor nan": [str(checkpoint), str(data)]}.get(
        command, [str(data)]
    )
    result = runner.invoke(app, [*command.split(), *args, "--format", "coco"])
    assert isinstance(result.exception, _Stop), result.output
    assert seen["format"] == "coco"


def test_val_reports_deeppcb_figures_only_on_deeppcb_data(
    trained_run: Path, tiny_data: Path, tmp_path: Path
) -> None:
    """Synthetic boards in YOLO layout: COCO's figures only, nothing of DeepPCB's in the report (its cards were
    shown on every dataset); `--protocol both` still asks for them (test above)."""
    out = tmp_path / "val"
    result = runner.invoke(app, ["val", str(trained_run / "best.pt"), str(tiny_data), "--out", str(out)])
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert "deeppcb" not in metrics and not (out / "deeppcb_results").exists()
    assert "DeepPCB" not in (out / "report.html").read_text()
