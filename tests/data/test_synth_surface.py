"""Synthetic surfaces: exact boxes per defect kind, sizes, colour mix, determinism, dataset files."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import yaml

from defectdet.data.synth import SURFACE_CLASS_NAMES, generate_surface, synthesize_dataset
from defectdet.data.synth.surface import BOX_ALPHA, DEFECT_MAKERS, _Canvas, surface_size
from defectdet.errors import DefectDetError


@pytest.mark.parametrize("class_id", range(len(DEFECT_MAKERS)))
@pytest.mark.parametrize("channels", [1, 3])
def test_each_defect_changes_pixels_only_inside_its_box(class_id: int, channels: int) -> None:
    height, width = 300, 420
    base = np.full((height, width, channels), 128.0, np.float32)
    tint = np.array([1.1, 1.0, 0.8], np.float32) if channels == 3 else None
    for trial in range(5):
        canvas = _Canvas(base.copy(), "brushed", 0.3, 128.0, tint)
        made = DEFECT_MAKERS[class_id](canvas, np.random.default_rng([class_id, trial]), min(height, width))
        if made is None:
            continue
        (x1, y1, x2, y2), made_class = made
        assert made_class == class_id
        assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height
        change = np.abs(canvas.image - base).max(2)  # (H, W)
        inside = np.zeros_like(change, bool)
        inside[int(y1) : int(y2), int(x1) : int(x2)] = True
        peak = change[inside].max()
        assert peak > 5  # the defect is visible
        # outside the box only faint fringes (alpha < BOX_ALPHA; patches vary inside by up to 0.55x)
        assert change[~inside].max(initial=0) <= 2 * BOX_ALPHA * peak
        # the box is tight: every edge row/column of it holds changed pixels
        box = change[int(y1) : int(y2), int(x1) : int(x2)] > 0
        assert box[0].any() and box[-1].any() and box[:, 0].any() and box[:, -1].any()
        return
    pytest.fail(f"defect {SURFACE_CLASS_NAMES[class_id]} was never drawn in 5 tries")


def test_sizes_span_the_range_and_are_non_square() -> None:
    rng = np.random.default_rng(0)
    sizes = np.array([surface_size(rng, 128, 2048) for _ in range(400)])
    assert sizes.min() >= 128 and sizes.max() <= 2048
    assert sizes.max(1).min() < 200 and sizes.max(1).max() > 1500
    aspect = sizes.max(1) / sizes.min(1)
    assert (aspect > 1.3).mean() > 0.3
    assert (sizes[:, 0] > sizes[:, 1]).any() and (sizes[:, 0] < sizes[:, 1]).any()


def test_generate_surface_is_deterministic_with_all_kinds_across_sizes() -> None:
    first = generate_surface(5, 3, 128, 256, color=True)
    again = generate_surface(5, 3, 128, 256, color=True)
    assert np.array_equal(first.image, again.image) and np.array_equal(first.boxes, again.boxes)
    classes, materials, relative = set(), set(), []
    for index in range(40):
        surface = generate_surface(1, index, 128, 256, color=index % 2 == 0)
        height, width = surface.image.shape[:2]
        assert surface.image.dtype == np.uint8 and surface.image.ndim == (3 if index % 2 == 0 else 2)
        boxes = surface.boxes
        assert (
            (boxes[:, 0] >= 0) & (boxes[:, 2] <= width) & (boxes[:, 1] >= 0) & (boxes[:, 3] <= height)
        ).all()
        classes.update(surface.classes.tolist())
        materials.add(surface.material)
        relative += (np.sqrt((boxes[:, 2:] - boxes[:, :2]).prod(1)) / max(height, width)).tolist()
    assert classes == set(range(len(SURFACE_CLASS_NAMES)))
    assert len(materials) >= 4
    assert min(relative) < 0.05 and max(relative) > 0.4  # pin-holes to patches over most of the image


def test_synthesize_surface_dataset(tmp_path) -> None:
    data_yaml = synthesize_dataset(
        tmp_path / "set", boards=8, seed=2, kind="surface", max_size=300, progress=False
    )
    config = yaml.safe_load(data_yaml.read_text())
    assert config["names"] == list(SURFACE_CLASS_NAMES) and "templates" not in config
    images = sorted((tmp_path / "set" / "images").glob("*/*.png"))
    assert len(images) == 8 and all(path.name.startswith("surface_") for path in images)
    channels = {cv2.imread(str(path), cv2.IMREAD_UNCHANGED).ndim for path in images}
    assert channels == {2, 3}  # gray and colour by default
    with pytest.raises(DefectDetError, match="template"):
        synthesize_dataset(tmp_path / "bad", boards=2, kind="surface", template=True, progress=False)
    with pytest.raises(DefectDetError, match="kind"):
        synthesize_dataset(tmp_path / "bad", boards=2, kind="steel", progress=False)
