"""Image lists (reviewed.txt, YOLO .txt splits): one image per line, whatever characters the file names hold."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from defectdet.data.formats import load_dataset
from defectdet.data.formats.yolo import fits_image_list


def _image(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = (24, 32, 3) if path.suffix == ".ppm" else (24, 32)  # PPM is colour only
    assert cv2.imwrite(str(path), np.full(shape, 90, np.uint8))
    return path


def test_a_name_with_a_line_break_stays_out_of_reviewed_txt(tmp_path: Path) -> None:
    from defectdet.serve.review import ReviewFolder
    from defectdet.serve.upload import UploadError

    for name in ("a.png", "b\nc.png", "d\u2028e.png", "f\rg.png"):
        _image(tmp_path / "images" / name)
    folder = ReviewFolder(tmp_path, class_names=["defect"], operator="olga")
    assert [path.name for path in folder.images()] == ["a.png"]
    with pytest.raises(UploadError, match="no image"):
        folder.decide("b\nc.png", "clean")
    folder.decide("a.png", "accept", [{"class_id": 0, "box": [2, 2, 12, 12]}])
    assert (tmp_path / "reviewed.txt").read_text() == "./images/a.png\n"
    split = load_dataset(tmp_path / "data.yaml", "train")
    assert [s.image_path.name for s in split.samples] == ["a.png"] and split.problems == []


def test_a_list_breaks_lines_at_newlines_only(tmp_path: Path) -> None:
    """A form feed or U+2028 is a (legal) character of a file name, not a line break of the list."""
    names = ["x\x0cy.png", "p\u2028q.png", "plain.png"]
    for name in names:
        _image(tmp_path / "images" / name)
    (tmp_path / "list.txt").write_text("".join(f"./images/{name}\n" for name in names), encoding="utf-8")
    (tmp_path / "data.yaml").write_text("path: .\ntrain: list.txt\nnames: [defect]\n")
    split = load_dataset(tmp_path / "data.yaml", "train")
    assert split.problems == [] and sorted(s.image_path.name for s in split.samples) == sorted(names)
    assert [fits_image_list(name) for name in names] == [False, False, True]


def test_predict_and_the_dataset_readers_take_every_accepted_suffix(tmp_path: Path) -> None:
    """One suffix list (data.imageio.IMAGE_SUFFIXES): a .pnm or .pbm the service keeps is predicted on, and is
    an image of a dataset folder too."""
    from defectdet.data.imageio import IMAGE_SUFFIXES
    from defectdet.runtime.predict import list_sources

    suffixes = (".png", ".pnm", ".pbm", ".pgm", ".ppm", ".tif")
    assert set(suffixes) <= IMAGE_SUFFIXES
    for index, suffix in enumerate(suffixes):
        _image(tmp_path / "images" / "train" / f"b{index}{suffix}")
        (tmp_path / "labels" / "train").mkdir(parents=True, exist_ok=True)
        (tmp_path / "labels" / "train" / f"b{index}.txt").write_text("0 0.5 0.5 0.25 0.25\n")
    assert [path.suffix for path in list_sources(tmp_path / "images" / "train")] == list(suffixes)
    (tmp_path / "data.yaml").write_text("path: .\ntrain: images/train\nnames: [defect]\n")
    split = load_dataset(tmp_path / "data.yaml", "train")
    assert split.problems == [] and [s.image_path.suffix for s in split.samples] == list(suffixes)
