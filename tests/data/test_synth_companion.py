"""`defectdet synth --companion NAME`: an aligned second lighting of every synthetic image, read back as a
companion capture by the dataset reader and the training dataset."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.data.formats import load_dataset
from defectdet.data.sample import common_companions
from defectdet.data.synth import generate_surface, synthesize_dataset
from defectdet.data.synth.companion import GAIN, companion_capture, faint_defects
from defectdet.errors import DefectDetError
from defectdet.trainingdata.dataset import DetectionDataset, ItemLayout


def test_synth_companions_are_aligned_captures_the_dataset_reads(tmp_path: Path) -> None:
    out = tmp_path / "two-lights"
    result = CliRunner().invoke(app, ["synth", str(out), "--kind", "surface", "--boards", "5", "--min-size", "64",
                                      "--max-size", "96", "--gray", "--companion", "L2,UV"])  # fmt: skip
    assert result.exit_code == 0, result.output
    split = load_dataset(out / "data.yaml", "train")
    assert split.companion_names == ["L2", "UV"] and not split.problems
    assert common_companions(split.samples, split.companion_names) == ["L2", "UV"]
    for sample in split.samples:
        image = cv2.imread(str(sample.image_path), cv2.IMREAD_UNCHANGED)
        for name, path in sample.companion_paths.items():
            assert path == out / "companions" / name / "train" / sample.image_path.name
            companion = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
            assert companion.shape == image.shape and not np.array_equal(companion, image)
    dataset = DetectionDataset(split, ItemLayout(input_size=64, dtype=torch.uint8, companions=["L2", "UV"]))
    tensor, _, meta = dataset[0]
    assert tensor.shape == (3, 64, 64) and set(meta["companion_paths"]) == {"L2", "UV"}


def test_defects_are_faint_in_the_image_and_plain_in_the_companion() -> None:
    surface = generate_surface(3, 1, 96, 128, clean=True)
    assert surface.clean is not None and len(surface.boxes)
    defects = np.abs(surface.image.astype(np.float32) - surface.clean)
    marked = defects > 10
    faint = np.abs(faint_defects(surface.image, surface.clean).astype(np.float32) - surface.clean)
    lit, unlit = (
        companion_capture(image, surface.clean, np.random.default_rng(0), 0).astype(np.float32)
        for image in (surface.image, surface.clean)
    )
    assert faint[marked].mean() < 0.5 * defects[marked].mean()
    assert np.abs(lit - unlit)[marked].mean() > 0.8 * GAIN * defects[marked].mean()


def test_companion_names_are_checked() -> None:
    with pytest.raises(DefectDetError, match="given twice"):
        synthesize_dataset(Path("unused"), boards=1, companions=("L2", "L2"))
