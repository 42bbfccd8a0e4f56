"""Clean recaptures: drawn nuisances are applied, recorded and reproducible; registration undoes the motion."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from pydantic import ValidationError

from defectdet.data.recapture import RecaptureConfig, make_clean_boards, recapture
from defectdet.data.registration import register_pair
from defectdet.data.sample import DatasetSplit, Sample
from defectdet.errors import ConfigError


def textured(size: int = 320, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    image = np.full((size, size), 40, np.uint8)
    for _ in range(40):
        x, y = (int(v) for v in rng.integers(0, size - 20, 2))
        cv2.rectangle(image, (x, y), (x + int(rng.integers(4, 30)), y + int(rng.integers(4, 30))), 210, -1)
    return image


def test_none_is_an_exact_copy_and_defaults_are_not() -> None:
    image = textured()
    same, params = recapture(image, RecaptureConfig.none(), np.random.default_rng(0))
    assert np.array_equal(same, image) and params["jpeg_quality"] is None
    other, params = recapture(image, RecaptureConfig(), np.random.default_rng(0))
    assert other.shape == image.shape and other.dtype == np.uint8
    assert 0.25 <= np.hypot(params["dx"], params["dy"]) <= 2.0 and abs(params["angle_deg"]) <= 0.25
    assert 75 <= params["jpeg_quality"] <= 95
    assert np.abs(other.astype(int) - image).mean() > 1.0


def test_fixed_motion_is_recovered_by_registration() -> None:
    image = textured(seed=1)
    config = RecaptureConfig().with_motion(2.0, 0.5)
    moved, params = recapture(image, config, np.random.default_rng(4))
    assert np.hypot(params["dx"], params["dy"]) == pytest.approx(2.0)
    assert abs(params["angle_deg"]) == pytest.approx(0.5)
    _, found = register_pair(moved, image)
    assert abs(found.dx - params["dx"]) < 0.25 and abs(found.dy - params["dy"]) < 0.25
    assert abs(found.angle_deg - params["angle_deg"]) < 0.1


def test_config_validation() -> None:
    with pytest.raises(ValidationError):
        RecaptureConfig(shift_px=(2.0, 1.0))
    with pytest.raises(ValidationError):
        RecaptureConfig(jpeg_quality=(50, 120))
    with pytest.raises(ValidationError):
        RecaptureConfig(shift=(1, 2))  # type: ignore[call-arg]


def test_make_clean_boards_writes_reproducible_boards(tmp_path: Path) -> None:
    samples = []
    for index in range(3):
        template = tmp_path / f"t{index}.png"
        cv2.imwrite(str(template), textured(96, seed=index))
        samples.append(
            Sample(tmp_path / f"t{index}.png", np.zeros((1, 4)), np.zeros(1), template, image_id=f"b{index}")
        )
    split = DatasetSplit(samples, ["defect"], "yolo", "val", tmp_path, [])
    first = make_clean_boards(split, tmp_path / "a", RecaptureConfig(), seed=3)
    second = make_clean_boards(split, tmp_path / "b", RecaptureConfig(), seed=3)
    assert [s.image_id for s in first] == ["b0_clean", "b1_clean", "b2_clean"]
    assert all(len(s.boxes) == 0 and s.template_path is not None for s in first)
    for a, b in zip(first, second, strict=True):
        assert np.array_equal(cv2.imread(str(a.image_path)), cv2.imread(str(b.image_path)))
    record = json.loads((tmp_path / "a" / "clean_boards.json").read_text())
    assert len(record["boards"]) == 3 and record["seed"] == 3
    no_templates = DatasetSplit(
        [Sample(tmp_path / "t0.png", np.zeros((0, 4)), np.zeros(0))], ["d"], "yolo", "val", tmp_path, []
    )
    with pytest.raises(ConfigError, match="no template"):
        make_clean_boards(no_templates, tmp_path / "c", RecaptureConfig())


def test_clean_boards_of_ids_with_a_subfolder_are_written_inside_the_folder(tmp_path: Path) -> None:
    """A reviewed folder's ids are `images/NAME`: the clean board goes to `images/NAME_clean.png` below out."""
    template = tmp_path / "t.png"
    cv2.imwrite(str(template), textured(96))
    sample = Sample(tmp_path / "t.png", np.zeros((0, 4)), np.zeros(0), template, image_id="images/t")
    split = DatasetSplit([sample], ["defect"], "yolo", "val", tmp_path, [])
    (board,) = make_clean_boards(split, tmp_path / "clean", RecaptureConfig(), seed=1)
    assert board.image_path == tmp_path / "clean" / "images" / "t_clean.png" and board.image_path.is_file()
