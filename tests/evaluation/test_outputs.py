"""Result files, plots, report.html, evaluate_records and the stage timer."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest

from defectdet.evaluation import plots
from defectdet.evaluation.deeppcb import read_deeppcb_results, write_deeppcb_results
from defectdet.evaluation.operating_point import confusion_matrix, operating_points
from defectdet.evaluation.report import evaluate_records, write_report
from defectdet.evaluation.timing import StageTimer
from defectdet.evaluation.types import ImageRecord

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NAMES = ["open", "short", "mouse_bite", "scratch"]


def synthetic_records(count: int = 12, seed: int = 0) -> list[ImageRecord]:
    """Jittered copies of the ground truth, some misses and false alarms; every 4th image is clean."""
    rng = np.random.default_rng(seed)
    records = []
    for index in range(count):
        clean = index % 4 == 3
        number = 0 if clean else int(rng.integers(1, 5))
        corners = rng.uniform(0, 100, (number, 2))
        gt = np.concatenate([corners, corners + rng.uniform(8, 24, (number, 2))], axis=1)
        classes = rng.integers(0, len(NAMES), number)
        found = rng.random(number) < 0.8
        det = gt[found] + rng.normal(0, 1.0, (int(found.sum()), 4))
        det_classes = classes[found]
        scores = rng.uniform(0.4, 1.0, len(det))
        if rng.random() < 0.4:  # a false alarm
            det = np.concatenate([det, [[5, 5, 20, 20]]])
            det_classes = np.append(det_classes, rng.integers(0, len(NAMES)))
            scores = np.append(scores, rng.uniform(0.1, 0.7))
        records.append(ImageRecord(f"img{index:03d}", 128, 128, gt, classes, det, scores, det_classes))
    return records


def assert_png(path):
    assert path.is_file() and path.stat().st_size > 2000
    assert path.read_bytes()[:8] == PNG_SIGNATURE


def test_deeppcb_result_files_round_trip(tmp_path):
    records = [
        ImageRecord(
            "00041000",
            640,
            640,
            det_boxes=[[10.4, 20.6, 50.5, 641.0], [1, 2, 3, 4]],
            det_scores=[0.51234567, 0.9],
            det_classes=[2, 0],
        ),
        ImageRecord("00041001", 640, 640),
    ]
    paths = write_deeppcb_results(records, tmp_path, NAMES)
    assert [path.name for path in paths] == ["00041000.txt", "00041001.txt"]
    lines = paths[0].read_text().splitlines()
    for line in lines:  # the DeepPCB script's format: integers, no spaces
        assert re.fullmatch(r"\d+,\d+,\d+,\d+,\d\.\d{4,},[a-z-]+", line), line
    assert read_deeppcb_results(paths[0]) == [
        (1, 2, 3, 4, pytest.approx(0.9), "open"),  # highest score first
        (
            10,
            21,
            50,
            640,
            pytest.approx(0.512346),
            "mousebite",
        ),  # rounded, clipped to the image; alias mapped
    ]
    assert paths[1].read_text() == ""  # images without detections still get a file
    # a class name DeepPCB does not know is written as is
    write_deeppcb_results(
        [ImageRecord("x", 64, 64, det_boxes=[[1, 1, 5, 5]], det_scores=[0.5], det_classes=[3])],
        tmp_path,
        NAMES,
    )
    assert read_deeppcb_results(tmp_path / "x.txt")[0][5] == "scratch"


def test_result_files_of_a_reviewed_folder_keep_its_images_subfolder(tmp_path):
    """The review lists `./images/NAME` in reviewed.txt: those ids carry a sub-folder, which the writer creates;
    an id that climbs out (`../../x`) still lands inside the output folder."""
    import cv2

    from defectdet.data.formats import load_dataset
    from defectdet.serve.review import ReviewFolder

    kept = tmp_path / "kept"
    (kept / "images").mkdir(parents=True)
    for name in ("a.png", "b.png"):
        cv2.imwrite(str(kept / "images" / name), np.full((32, 40), 128, np.uint8))
    folder = ReviewFolder(kept, class_names=list(NAMES), operator="olga")
    folder.decide("a.png", "accept", [{"class_id": 1, "box": [2, 3, 12, 14]}])
    folder.decide("b.png", "clean")
    samples = [s for split in ("train", "val") for s in load_dataset(kept / "data.yaml", split).samples]
    assert sorted(sample.image_id for sample in samples) == ["images/a", "images/b"]
    records = [ImageRecord(sample.image_id, 40, 32) for sample in samples]
    records.append(
        ImageRecord("../../x", 40, 32, det_boxes=[[1, 1, 5, 5]], det_scores=[0.5], det_classes=[0])
    )
    out = tmp_path / "results"
    paths = write_deeppcb_results(records, out, NAMES)
    assert sorted(path.relative_to(out).as_posix() for path in paths) == [
        "images/a.txt",
        "images/b.txt",
        "x.txt",
    ]
    assert read_deeppcb_results(out / "x.txt")[0][:4] == (1, 1, 5, 5)


def test_plots_are_written_as_png(tmp_path):
    records = synthetic_records()
    operating = operating_points(records, NAMES)
    threshold = operating.summary["chosen"]["threshold"]
    assert_png(plots.plot_pr_curves(operating.class_curves, NAMES, tmp_path / "pr.png"))
    assert_png(plots.plot_threshold_curves(operating, tmp_path / "thr.png"))
    assert_png(
        plots.plot_confusion_matrix(
            confusion_matrix(records, len(NAMES), threshold), NAMES, tmp_path / "cm.png", threshold
        )
    )
    loaded = []

    def load(record):
        loaded.append(record.image_id)
        return np.full((record.height, record.width), 200, dtype=np.uint8)

    assert_png(
        plots.plot_prediction_grid(
            records, NAMES, tmp_path / "grid.png", threshold, load_image=load, max_images=4
        )
    )
    assert len(loaded) == 4
    csv_path = tmp_path / "metrics.csv"
    with open(csv_path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["epoch", "train/loss", "train/box_loss", "val/loss", "val/mAP50", "lr"])
        for epoch in range(1, 6):
            writer.writerow(
                [epoch, 3 / epoch, 2 / epoch, "" if epoch == 1 else 3.5 / epoch, 0.2 * epoch, 0.01]
            )
    assert_png(plots.plot_loss_curves(csv_path, tmp_path / "loss.png"))


def test_evaluate_records_writes_metrics_plots_and_self_contained_report(tmp_path):
    records = synthetic_records()
    timer = StageTimer()
    for _ in records:
        for stage in ("decode", "model"):
            with timer.stage(stage):
                pass
        timer.add_images(1)
    (tmp_path / "metrics.csv").write_text("epoch,train/loss,val/mAP50\n1,2.0,0.3\n2,1.5,0.5\n")
    metrics = evaluate_records(
        records,
        NAMES,
        tmp_path,
        "both",
        target_recall=0.99,
        timing=timer,
        settings={"checkpoint": "best.pt <latest>"},
    )
    saved = json.loads((tmp_path / "metrics.json").read_text())  # strict JSON: no NaN
    assert saved == metrics
    assert set(saved) >= {"coco", "deeppcb", "operating_point", "per_class", "headline", "timing"}
    assert 0.3 < saved["headline"]["mAP50"] <= 1.0
    assert saved["headline"]["false_call_rate"] is not None
    assert saved["timing"]["images"] == len(records)
    for name in ("pr_curve", "threshold_curves", "confusion_matrix", "val_predictions", "loss"):
        assert_png(tmp_path / f"{name}.png")
    html = (tmp_path / "report.html").read_text()
    assert "http" not in html  # no external resource of any kind
    assert not re.search(r"<(script|link)\b", html)
    assert html.count('src="data:image/png;base64,') == 5
    assert "best.pt &lt;latest&gt;" in html  # settings are escaped
    assert "mouse_bite" in html and "escape rate" in html


def test_evaluate_records_deeppcb_only_without_plots(tmp_path):
    metrics = evaluate_records(
        synthetic_records(6),
        NAMES,
        tmp_path,
        "deeppcb",
        plots=False,
        deeppcb_results_dir=tmp_path / "results",
    )
    assert "coco" not in metrics and metrics["deeppcb"]["mAP"] is not None
    assert metrics["headline"]["mAP50"] is None
    assert len(list((tmp_path / "results").glob("*.txt"))) == 6
    assert not (tmp_path / "report.html").exists()
    with pytest.raises(ValueError, match="protocol"):
        evaluate_records([], NAMES, tmp_path, "voc")


def test_write_report_with_minimal_metrics(tmp_path):
    path = write_report(tmp_path, {"operating_point": {}}, {}, "empty <run>", {})
    text = path.read_text()
    assert "empty &lt;run&gt;" in text and "no plots" in text


def test_stage_timer_summary():
    timer = StageTimer()
    timer.add("model", 0.030)
    timer.add("decode", 0.010)
    timer.add("model", 0.030)
    timer.add_images(2)
    summary = timer.summary()
    assert list(summary["ms_per_image"]) == ["decode", "model"]  # canonical stage order
    assert summary["ms_per_image"]["model"] == pytest.approx(30.0)
    assert summary["total_ms_per_image"] == pytest.approx(35.0)
    assert summary["images_per_second"] == pytest.approx(2 / 0.070)
    with timer.stage("postprocess"):
        pass
    assert timer.calls["postprocess"] == 1
    assert StageTimer().summary()["images_per_second"] is None
