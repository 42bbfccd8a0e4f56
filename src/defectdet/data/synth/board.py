"""One synthetic board: layout -> defects -> tested image and template, with exact boxes."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from defectdet.data.synth.defects import add_defects
from defectdet.data.synth.layout import generate_layout
from defectdet.data.synth.render import make_style, render_image


@dataclass
class SynthBoard:
    """A rendered board pair; boxes are xyxy pixels of `image`."""

    image: np.ndarray  # (H, W) uint8 gray or (H, W, 3) uint8 RGB, the tested board
    template: np.ndarray  # same shape, the defect-free board (slightly misregistered)
    boxes: np.ndarray  # (N, 4) float32 x1, y1, x2, y2
    classes: np.ndarray  # (N,) int64
    clean: np.ndarray | None = (
        None  # with `clean=True`: the tested board without its defects, same light and noise
    )


def _label(copper: np.ndarray, holes: np.ndarray) -> np.ndarray:
    label = (copper > 0).astype(np.uint8)
    label[holes > 0] = 2
    return label


def generate_board(
    seed: int, index: int, min_size: int = 480, max_size: int = 800, color: bool = False, clean: bool = False
) -> SynthBoard:
    """Generate board number `index` of the set seeded by `seed` (independent of other boards). `clean` also
    renders the tested board without its defects through the same camera draws (`SynthBoard.clean`)."""
    layout_rng, defect_rng, style_rng, tested_rng, template_rng = (
        np.random.default_rng(child) for child in np.random.SeedSequence([seed, index]).spawn(5)
    )
    height = int(layout_rng.integers(min_size, max_size + 1))
    width = int(layout_rng.integers(min_size, max_size + 1))
    layout = generate_layout(layout_rng, height, width)
    copper, holes, defects = add_defects(layout, defect_rng)
    style = make_style(style_rng, height, width, color)
    tested_pads = layout.pads.copy()
    tested_pads[(layout.holes > 0) & (holes == 0)] = 255  # a missing drill leaves bare pad copper
    clean_image = (
        render_image(_label(layout.copper, layout.holes), layout.pads, style, copy.deepcopy(tested_rng))
        if clean
        else None
    )
    image = render_image(_label(copper, holes), tested_pads, style, tested_rng)
    magnitude = template_rng.uniform(0, 1) ** 2 * 1.5
    angle = template_rng.uniform(0, 2 * np.pi)
    template = render_image(
        _label(layout.copper, layout.holes),
        layout.pads,
        style,
        template_rng,
        shift=(float(magnitude * np.cos(angle)), float(magnitude * np.sin(angle))),
        rotation_degrees=float(template_rng.uniform(-0.04, 0.04)),
    )
    boxes = np.array([defect.box for defect in defects], dtype=np.float32).reshape(-1, 4)
    classes = np.array([defect.class_id for defect in defects], dtype=np.int64)
    return SynthBoard(image, template, boxes, classes, clean_image)
