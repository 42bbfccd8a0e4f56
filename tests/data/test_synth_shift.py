"""`defectdet synth --shift lamp|lens|camera`: the same kind of boards on a shifted line, templates as before."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.data.synth.shift import shift_image
from defectdet.errors import DefectDetError

runner = CliRunner()
SMALL = ["--boards", "4", "--seed", "3", "--min-size", "160", "--max-size", "192"]


def _files(root: Path, folder: str) -> dict[str, bytes]:
    return {
        p.relative_to(root / folder).as_posix(): p.read_bytes() for p in sorted((root / folder).rglob("*.*"))
    }


def test_each_shift_changes_the_look_it_names() -> None:
    rng = np.random.default_rng(0)
    board = cv2.GaussianBlur(rng.integers(40, 220, (96, 128)).astype(np.uint8), (0, 0), 1.0)
    lamp, lens, camera = (shift_image(board, [name], seed=7) for name in ("lamp", "lens", "camera"))
    assert lamp.mean() < 0.75 * board.mean() and lamp.std() < board.std()  # darker, less contrast
    sharpness = [cv2.Laplacian(image, cv2.CV_32F).var() for image in (board, lens)]
    flat = shift_image(np.full((96, 128), 200, np.uint8), ["lens"], seed=7)
    assert sharpness[1] < 0.5 * sharpness[0] and flat[0, 0] < 0.75 * flat[48, 64]  # softer, darker corners
    assert (
        camera.mean() > board.mean() + 20
        and np.abs(camera.astype(int) - shift_image(board, ["camera"], 8)).max()
    )
    assert np.array_equal(camera, shift_image(board, ["camera"], seed=7))  # seeded
    with pytest.raises(DefectDetError, match="choose from lamp, lens, camera"):
        shift_image(board, ["flash"], 0)


def test_synth_shift_changes_tested_images_only(tmp_path: Path) -> None:
    assert runner.invoke(app, ["synth", str(tmp_path / "a"), *SMALL]).exit_code == 0
    result = runner.invoke(app, ["synth", str(tmp_path / "b"), *SMALL, "--shift", "lamp,camera"])
    assert result.exit_code == 0, result.output
    assert "shifted line (lamp, camera): 4 tested images changed" in result.output
    before, after = tmp_path / "a", tmp_path / "b"
    assert _files(before, "templates") == _files(after, "templates")  # captured before the change
    assert _files(before, "labels") == _files(after, "labels")  # the boxes do not move
    old, new = _files(before, "images"), _files(after, "images")
    assert old.keys() == new.keys() and all(old[name] != new[name] for name in old)
    assert json.loads((after / "shift.json").read_text())["shifts"] == ["lamp", "camera"]
    again = runner.invoke(app, ["synth", str(tmp_path / "c"), *SMALL, "--shift", "lamp,camera"])
    assert again.exit_code == 0 and _files(tmp_path / "c", "images") == new  # reproducible
    bad = runner.invoke(app, ["synth", str(tmp_path / "d"), *SMALL, "--shift", "lamp,lamp"])
    assert bad.exit_code != 0 and not (tmp_path / "d").exists()
