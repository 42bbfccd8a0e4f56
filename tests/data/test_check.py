"""check_dataset / render_check_report / run_check: severities, file:line, exit codes."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from defectdet.data.check import check_dataset, render_check_report, run_check

DEEPPCB = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "deeppcb"  # ../shared beside the repo


def _console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=200, color_system=None), buffer


def _find(report, file_name: str, line: int = 0):
    return [p for p in report.problems if Path(p.path).name == file_name and p.line == line]


def test_clean_deeppcb_passes_with_counts(deeppcb_root: Path) -> None:
    report = check_dataset(deeppcb_root)
    # the fixture's test.txt repeats a trainval pair: the one thing to say (trainval holding val is by design)
    assert not report.has_errors and {p.message.split(" (")[0] for p in report.problems} == {
        "1 of 1 images of split 'test' are also in split 'train'",
        "1 of 1 images of split 'test' are also in split 'trainval'",
    }
    stats = {s.name: s for s in report.splits}
    assert set(stats) == {"train", "val", "test", "trainval"}
    assert stats["trainval"].images == 3 and stats["trainval"].templates_found == 3
    assert stats["trainval"].boxes_per_class[0] == 3 and stats["trainval"].boxes_per_class[5] == 1
    assert stats["trainval"].size_summary() == {"width": (100, 100, 100), "height": (80, 80, 80)}
    console, buffer = _console()
    assert run_check(deeppcb_root, console=console) == 0
    assert "OK" in buffer.getvalue() and "pin-hole" in buffer.getvalue()


def test_image_problems_are_errors(deeppcb_root: Path) -> None:
    folder = deeppcb_root / "group1000/1000"
    (folder / "1000000_test.jpg").write_bytes(b"")  # zero bytes
    data = (folder / "1000001_test.jpg").read_bytes()
    (folder / "1000001_test.jpg").write_bytes(data[: len(data) // 2])  # truncated
    report = check_dataset(deeppcb_root)
    assert report.has_errors
    messages = {Path(p.path).name: p.message for p in report.errors}
    assert "empty" in messages["1000000_test.jpg"]
    assert "1000001_test.jpg" in messages
    assert len(_find(report, "1000001_test.jpg")) == 1  # listed once although in several splits


def test_label_problems_severity_and_line(deeppcb_root: Path, writers) -> None:
    writers.text(
        deeppcb_root / "group1000/1000_not/1000001.txt",
        "1 1 2 3 2\n10 10 30 20 9\n5 5 5 20 1\n600 10 700 20 1",
    )
    (deeppcb_root / "group2000/2000/2000000_temp.jpg").unlink()
    report = check_dataset(deeppcb_root)
    assert [p.severity for p in _find(report, "1000001.txt", 1)] == ["warning"]  # tiny box
    assert [p.severity for p in _find(report, "1000001.txt", 2)] == ["error"]  # class out of range
    assert [p.severity for p in _find(report, "1000001.txt", 3)] == ["error"]  # zero area
    assert [p.severity for p in _find(report, "1000001.txt", 4)] == ["error"]  # outside the image
    assert [p.severity for p in _find(report, "trainval.txt", 3)] == ["warning"]  # template missing
    assert {s.name: s.templates_missing for s in report.splits}["trainval"] == 1
    console, buffer = _console()
    assert run_check(deeppcb_root, console=console) == 1
    output = buffer.getvalue()
    assert "group1000/1000_not/1000001.txt:2" in output and "FAILED" in output


def test_warnings_alone_do_not_fail(deeppcb_root: Path) -> None:
    folder = deeppcb_root / "group1000/1000"
    shutil.copyfile(folder / "1000000_test.jpg", folder / "1000001_test.jpg")  # duplicate content
    (folder / "1000000_temp.jpg").unlink()
    report = check_dataset(deeppcb_root)
    assert not report.has_errors
    duplicate = _find(report, "1000001_test.jpg")
    assert duplicate and duplicate[0].severity == "warning" and "identical" in duplicate[0].message
    assert run_check(deeppcb_root, console=_console()[0]) == 0


def test_yolo_label_without_image_fails(tmp_path: Path, writers) -> None:
    root = tmp_path / "yolo"
    writers.image(root / "images/train/a.png", 40, 40)
    writers.text(root / "labels/train/a.txt", "0 0.5 0.5 0.5 0.5\n")
    writers.text(root / "labels/train/orphan.txt", "0 0.5 0.5 0.5 0.5\n")
    writers.text(root / "data.yaml", "train: images/train\nval: images/train\nnames: [flaw]\n")
    report = check_dataset(root)
    assert [p.severity for p in _find(report, "orphan.txt")] == ["error"]
    assert report.splits[0].boxes_per_class == [1]
    assert run_check(root, console=_console()[0]) == 1


def test_unreadable_dataset_exit_code(tmp_path: Path) -> None:
    console, buffer = _console()
    assert run_check(tmp_path / "missing", console=console) == 1
    assert "not found" in buffer.getvalue()


def test_problem_listing_is_capped(tmp_path: Path, writers) -> None:
    root = tmp_path / "yolo"
    writers.image(root / "images/train/a.png", 40, 40)
    writers.text(root / "labels/train/a.txt", "7 0.5 0.5 0.5 0.5\n" * 60)
    writers.text(root / "data.yaml", "train: images/train\nnames: [flaw]\n")
    report = check_dataset(root, deep=False)
    console, buffer = _console()
    render_check_report(report, console)
    assert len(report.errors) == 60 and "... and 10 more" in buffer.getvalue()


@pytest.mark.skipif(not (DEEPPCB / "trainval.txt").is_file(), reason="shared DeepPCB copy not present")
def test_real_deeppcb_counts() -> None:
    report = check_dataset(DEEPPCB, deep=False)
    stats = {s.name: s for s in report.splits}
    assert stats["trainval"].images == 1000 and stats["trainval"].templates_found == 1000
    assert stats["trainval"].boxes_per_class == [1283, 1028, 1379, 1142, 1010, 1031]
    assert stats["train"].images + stats["val"].images == 1000
    assert not report.has_errors


@pytest.mark.parametrize("raised", [NotImplementedError, TypeError, AttributeError, ValueError])
def test_a_decoder_crash_on_one_file_is_listed_and_the_check_goes_on(
    deeppcb_root: Path, monkeypatch: pytest.MonkeyPatch, raised: type[Exception]
) -> None:
    """A decoder raising something other than ImageReadError (Pillow plugins do on malformed files) makes that
    one file an error; every other file is still checked and the exit code is 1."""
    import defectdet.data.check as check_module

    real_decode = check_module.decode_image

    def decode(data, path, *args, **kwargs):
        if Path(path).name == "1000001_test.jpg":
            raise raised("decoder bug")
        return real_decode(data, path, *args, **kwargs)

    monkeypatch.setattr(check_module, "decode_image", decode)
    report = check_dataset(deeppcb_root)
    errors = {Path(p.path).name: p.message for p in report.errors}
    assert set(errors) == {"1000001_test.jpg"}
    assert raised.__name__ in errors["1000001_test.jpg"] and "decoder bug" in errors["1000001_test.jpg"]
    trainval = {s.name: s for s in report.splits}["trainval"]
    assert trainval.images == 3 and len(trainval.sizes) == 2  # the other two were decoded
    console, buffer = _console()
    assert run_check(deeppcb_root, console=console) == 1
    assert "1000001_test.jpg" in buffer.getvalue()


def test_a_header_reader_crash_in_the_loader_is_listed(
    deeppcb_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The format readers read image headers for box checks: a crash there is one file's error too."""
    import defectdet.data.check as check_module
    import defectdet.data.formats.deeppcb as deeppcb_module

    real_size = deeppcb_module.read_image_size

    def size(path):
        if Path(path).name in ("2000000_test.jpg", "1000000_temp.jpg"):
            raise NotImplementedError("header bug")
        return real_size(path)

    monkeypatch.setattr(deeppcb_module, "read_image_size", size)
    report = check_dataset(deeppcb_root)
    assert any(Path(p.path).name == "2000000_test.jpg" and "header bug" in p.message for p in report.errors)
    assert {s.name: s.images for s in report.splits}["trainval"] == 2
    monkeypatch.setattr(check_module, "read_image_size", size)  # --no-deep reads headers only
    shallow = check_dataset(deeppcb_root, deep=False)
    failed = {Path(p.path).name for p in shallow.errors}
    assert failed == {"2000000_test.jpg", "1000000_temp.jpg"}


def test_train_and_val_sharing_images_is_a_warning(tmp_path: Path, writers) -> None:
    root = tmp_path / "yolo"
    for index in range(3):
        writers.image(root / f"images/train/t{index}.png", 40, 40, value=index)
        writers.image(root / f"images/val/v{index}.png", 40, 40, value=10 + index)
    writers.text(root / "data.yaml", "train: images/train\nval: images/val\nnames: [flaw]\n")
    assert check_dataset(root).problems == []  # held out: nothing to say
    writers.text(root / "data.yaml", "train: images/train\nval: images/train\nnames: [flaw]\n")
    (warning,) = check_dataset(root).warnings  # the same files
    assert "3 of 3 images of split 'val' are also in split 'train'" in warning.message
    writers.text(root / "data.yaml", "train: images/train\nval: images/val\nnames: [flaw]\n")
    shutil.copy(root / "images/train/t1.png", root / "images/val/copy.png")  # the same content, renamed
    report = check_dataset(root)
    (warning,) = report.warnings
    assert "1 of 4 images of split 'val'" in warning.message and "copy.png" in warning.message
    assert not report.has_errors and run_check(root, console=_console()[0]) == 0
