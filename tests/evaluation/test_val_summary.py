"""What `val` prints and where it writes: figures named in words (no raw metric keys), DeepPCB's figures only on
DeepPCB data, escapes and false calls as counts of images ("not measured" without defect-free images), how the
threshold was chosen, and one output folder per run and checkpoint."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from defectdet.engine.validate import default_out_dir, print_summary

RAW_KEYS = ("mAP50_95", "deeppcb_", "escape_rate", "false_call_rate", "images_per_second", "threshold_source")


def _metrics(data_format: str = "yolo", clean: int = 0, false_calls: int = 0) -> dict:
    headline = {
        "mAP50": 0.91, "mAP50_95": 0.55, "deeppcb_mAP": 0.93, "deeppcb_F": 0.9, "deeppcb_F_at_threshold": 0.88,
        "threshold": 0.41, "precision": 0.8, "recall": 0.95, "f1": 0.87, "escape_rate": 0.1,
        "false_call_rate": false_calls / clean if clean else None, "target_recall_threshold": 0.2,
        "images_per_second": 12.5, "threshold_source": "0.41 (escape: split 'train' of line3)",
    }  # fmt: skip
    boards = {"defective_boards": 10, "escapes": 1, "clean_boards": clean, "false_calls": false_calls}
    return {
        "headline": headline,
        "boards": {"threshold": 0.41, **boards},
        "operating_point": {"target_recall": 0.99},
        "threshold": {
            "threshold": 0.41,
            "rule": "escape",
            "source": "split 'train' of line3",
            "target_escape": 0.01,
        },
        "data_format": data_format,
    }


def _printed(metrics: dict) -> str:
    console = Console(record=True, width=140)
    print_summary(console, metrics)
    return console.export_text()


def test_the_table_names_each_figure_in_words_and_says_false_calls_were_not_measured() -> None:
    text = _printed(_metrics())
    for words in ("mAP@0.5", "operating threshold", "recall (defects found)", "escapes", "false calls"):
        assert words in text, words
    assert "1 of 10 defective images (10.0%)" in text
    assert "not measured (no defect-free images)" in text
    assert "false calls need defect-free images" in text and "--clean-templates" in text
    assert "threshold for 99% recall" in text and "12.5 images/s" in text
    assert "at most 1% of the defective images of split 'train' of line3" in text
    assert not [key for key in RAW_KEYS if key in text], text
    assert "DeepPCB" not in text  # not DeepPCB data


def test_false_calls_are_counted_when_there_are_defect_free_images() -> None:
    text = _printed(_metrics(clean=8, false_calls=2))
    assert "2 of 8 defect-free images (25.0%)" in text
    assert "not measured" not in text and "false calls need" not in text


def test_deeppcb_figures_only_on_deeppcb_data() -> None:
    text = _printed(_metrics("deeppcb"))
    assert "DeepPCB mAP" in text and "DeepPCB F-score at the threshold" in text
    assert not [key for key in RAW_KEYS if key in text], text


def test_each_run_and_checkpoint_gets_its_own_output_folder() -> None:
    assert default_out_dir("runs/line3/best.pt") == Path("runs/val/line3-best")
    assert default_out_dir("runs/line4/best.pt") == Path("runs/val/line4-best")
    assert default_out_dir("runs/line3/last.pt") == Path("runs/val/line3-last")
    assert default_out_dir("line3.onnx") == Path("runs/val/line3")
    assert default_out_dir("models/line3-v2.onnx") == Path("runs/val/models-line3-v2")


def test_the_guides_point_at_the_reports_that_hold_the_figures() -> None:
    """The evaluate guide names the folder `val` writes; the demo page sends false calls to run/val/report.html
    (the evaluation with defect-free boards), not to the training run's report."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    evaluate = (docs / "guides" / "evaluate.md").read_text(encoding="utf-8")
    assert f"`{default_out_dir('runs/line3/best.pt').as_posix()}/`" in evaluate
    demo = " ".join((docs / "getting-started" / "demo.md").read_text(encoding="utf-8").split())
    assert "Open `run/val/report.html` in a browser" in demo
    pointer = demo[demo.index("Open `run/val/report.html`") :]
    assert pointer.index("false calls") < pointer.index("`run/report.html` has the training curves")
