"""Write synthetic boards as a YOLO-style dataset with templates and a data.yaml."""

from __future__ import annotations

import logging
from pathlib import Path

import cv2
import numpy as np
import yaml

from defectdet.data.synth.board import SynthBoard, generate_board
from defectdet.data.synth.defects import CLASS_NAMES
from defectdet.errors import DefectDetError

logger = logging.getLogger(__name__)


def _write_png(path: Path, image: np.ndarray) -> None:
    if image.ndim == 3:
        image = cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    if not cv2.imwrite(str(path), image):
        raise DefectDetError(f"{path}: could not write the image (disk full or not writable?)")


def _label_lines(board: SynthBoard) -> str:
    height, width = board.image.shape[:2]
    lines = []
    for (x1, y1, x2, y2), class_id in zip(board.boxes.tolist(), board.classes.tolist(), strict=True):
        lines.append(
            f"{class_id} {(x1 + x2) / 2 / width:.6f} {(y1 + y2) / 2 / height:.6f} "
            f"{(x2 - x1) / width:.6f} {(y2 - y1) / height:.6f}"
        )
    return "".join(line + "\n" for line in lines)


def _split_of_boards(boards: int, val_fraction: float, seed: int) -> list[str]:
    val_count = int(round(boards * val_fraction))
    if val_fraction > 0 and boards >= 2:
        val_count = min(max(val_count, 1), boards - 1)
    order = np.random.default_rng([seed, 0x5EED]).permutation(boards)
    splits = ["train"] * boards
    for index in order[:val_count]:
        splits[int(index)] = "val"
    return splits


def synthesize_dataset(
    out: Path,
    boards: int = 40,
    seed: int = 0,
    template: bool = True,
    min_size: int = 480,
    max_size: int = 800,
    val_fraction: float = 0.2,
    color: bool = False,
    progress: bool = True,
) -> Path:
    """Generate `boards` synthetic PCB images with exact defect boxes; returns `out/data.yaml`.

    Layout: `images/{train,val}/board_<4-digit index>.png`, `labels/...txt` (YOLO `cls cx cy w h`),
    `templates/...png` (when `template`), `data.yaml`. The same seed gives identical files.
    """
    out = Path(out)
    if boards < 1:
        raise DefectDetError(f"boards: must be at least 1, got {boards}")
    if seed < 0:
        raise DefectDetError(f"seed: must be a non-negative integer, got {seed}")
    if not 32 <= min_size <= max_size:
        raise DefectDetError(f"min_size/max_size: need 32 <= min_size <= max_size, got {min_size}/{max_size}")
    if not 0.0 <= val_fraction < 1.0:
        raise DefectDetError(f"val_fraction: must be in [0, 1), got {val_fraction}")
    splits = _split_of_boards(boards, val_fraction, seed)
    used_splits = sorted(set(splits), key=["train", "val"].index)
    kinds = ["images", "labels"] + (["templates"] if template else [])
    for kind in kinds:
        for split in ("train", "val"):
            (out / kind / split).mkdir(parents=True, exist_ok=True)

    def work(index: int) -> None:
        board = generate_board(seed, index, min_size, max_size, color)
        name = f"board_{index:04d}"
        split = splits[index]
        _write_png(out / "images" / split / f"{name}.png", board.image)
        if template:
            _write_png(out / "templates" / split / f"{name}.png", board.template)
        (out / "labels" / split / f"{name}.txt").write_text(_label_lines(board))

    if progress:
        from rich.progress import Progress

        with Progress(transient=False) as bar:
            task = bar.add_task("synthesizing boards", total=boards)
            for index in range(boards):
                work(index)
                bar.advance(task)
    else:
        for index in range(boards):
            work(index)

    config: dict = {"path": ".", "train": "images/train", "val": "images/val"}
    if template:
        config["templates"] = {"train": "templates/train", "val": "templates/val"}
    config["names"] = list(CLASS_NAMES)
    data_yaml = out / "data.yaml"
    data_yaml.write_text(yaml.safe_dump(config, sort_keys=False))
    logger.info("wrote %d boards (%s) to %s", boards, ", ".join(used_splits), out)
    return data_yaml
