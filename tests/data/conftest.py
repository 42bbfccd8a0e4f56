"""Helpers that write tiny datasets of each format into tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest


def write_image(path: Path, width: int = 64, height: int = 48, value: int = 0) -> Path:
    """A small gray image; `value` varies the content so files do not hash alike."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = np.full((height, width), value % 256, np.uint8)
    image[0, 0] = (value * 7 + 1) % 256
    assert cv2.imwrite(str(path), image)
    return path


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def write_deeppcb(root: Path, separator: str = " ") -> Path:
    """Two groups (1000: two pairs, 2000: one pair); list files trainval.txt and test.txt."""
    entries = [("1000", "1000000"), ("1000", "1000001"), ("2000", "2000000")]
    for index, (group, image_id) in enumerate(entries):
        folder = root / f"group{group}" / group
        write_image(folder / f"{image_id}_test.jpg", 100, 80, value=10 * index + 1)
        write_image(folder / f"{image_id}_temp.jpg", 100, 80, value=10 * index + 2)
        rows = [["10", "10", "30", "20", "1"], ["40", "40", "60", "70", "6"]]
        text = "\n".join(separator.join(row) for row in rows[: 1 + index % 2])
        write_text(root / f"group{group}" / f"{group}_not" / f"{image_id}.txt", text)
    lines = [f"group{g}/{g}/{i}.jpg group{g}/{g}_not/{i}.txt" for g, i in entries]
    write_text(root / "trainval.txt", "\n".join(lines))  # no final newline, like the real file
    write_text(root / "test.txt", lines[0] + "\n")
    return root


def write_coco(folder: Path, document: dict) -> Path:
    path = folder / "instances_val.json"
    write_text(path, json.dumps(document))
    return path


@pytest.fixture
def deeppcb_root(tmp_path: Path) -> Path:
    return write_deeppcb(tmp_path / "deeppcb")


@pytest.fixture
def writers():
    """The writer helpers above, as a fixture (test modules here cannot import conftest reliably)."""
    from types import SimpleNamespace

    return SimpleNamespace(image=write_image, text=write_text, deeppcb=write_deeppcb, coco=write_coco)
