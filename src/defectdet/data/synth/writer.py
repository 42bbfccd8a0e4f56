"""Write synthetic boards or surfaces as a YOLO-style dataset (templates for boards) and a data.yaml."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import yaml

from defectdet.compat import with_keywords
from defectdet.data.formats.yolo import label_line
from defectdet.data.synth.board import generate_board
from defectdet.data.synth.companion import checked_companion_names, companion_capture, faint_defects
from defectdet.data.synth.defects import CLASS_NAMES
from defectdet.data.synth.settings import SynthSettings
from defectdet.data.synth.shift import checked_shifts, shift_dataset
from defectdet.data.synth.surface import MATERIALS, SURFACE_CLASS_NAMES, generate_surface
from defectdet.errors import DefectDetError

KINDS = ("pcb", "surface")
DEFAULT_SIZES = {"pcb": (480, 800), "surface": (128, 2048)}
SURFACE_COLOR_SHARE = 0.5  # surfaces with colour=None: every other image (by hash of the index) is RGB

logger = logging.getLogger(__name__)


def _write_png(path: Path, image: np.ndarray) -> None:
    if image.ndim == 3:
        image = cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    if not cv2.imwrite(str(path), image):
        raise DefectDetError(f"{path}: could not write the image (disk full or not writable?)")


def _label_lines(image: np.ndarray, boxes: np.ndarray, classes: np.ndarray) -> str:
    height, width = image.shape[:2]
    lines = [
        label_line(class_id, box, width, height)
        for box, class_id in zip(boxes.tolist(), classes.tolist(), strict=True)
    ]
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


def synthesize_dataset(out: str | Path, settings: SynthSettings | None = None, **keywords: Any) -> Path:
    """Generate `settings.boards` synthetic images with exact defect boxes; returns `out/data.yaml`. `settings`
    is a `SynthSettings`; its fields may also be given as keywords, which apply over it (`boards`, `seed`,
    `kind`, `min_size`, ...).

    `kind='pcb'`: PCB boards (480-800 px, gray unless `color`) with their defect-free templates
    (`template` None = True). `kind='surface'`: textured surfaces (128-2048 px, non-square; `color`
    None = half of them RGB), no template (`template=True` is an error); `materials` limits their
    textures (None: all of `synth.surface.MATERIALS`).
    Layout: `images/{train,val}/<board|surface>_<4-digit index>.png`, `labels/...txt` (YOLO
    `cls cx cy w h`), `templates/...png` (boards with templates), `data.yaml`. The same seed gives
    identical files. `companions` (names): for each, an aligned second capture of every image under another
    lighting in `companions/NAME/{train,val}/`, declared in data.yaml's `companions:`; the images then show
    their defects faintly and each companion plainly (`synth.companion`). `shift` (names from
    `synth.shift.SHIFTS`): the tested images then show a shifted line, recorded in `shift.json`.
    """
    settings = _checked(with_keywords(SynthSettings, settings, keywords, "synthesize_dataset"))
    out = Path(out)
    splits = _split_of_boards(settings.boards, settings.val_fraction, settings.seed)
    _make_folders(out, settings)
    label = f"synthesizing {'surfaces' if settings.kind == 'surface' else 'boards'}"
    _run_each(
        functools.partial(_write_image, out, settings, splits),
        settings.boards,
        label if settings.progress else None,
    )
    data_yaml = _write_data_yaml(out, settings)
    used_splits = sorted(set(splits), key=["train", "val"].index)
    logger.info("wrote %d %s images (%s) to %s", settings.boards, settings.kind, ", ".join(used_splits), out)
    if settings.shift:
        changed = shift_dataset(out, settings.shift, settings.seed)
        logger.info("shifted line (%s): %d tested images changed", ", ".join(settings.shift), changed)
    return data_yaml


def _checked(settings: SynthSettings) -> SynthSettings:
    """`settings` checked (DefectDetError naming the setting), with the kind's defaults in place of None: the
    template, the sizes; the companion and shift names as lists of names."""
    kind = settings.kind
    if kind not in KINDS:
        raise DefectDetError(f"kind: must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "surface" and settings.template:
        raise DefectDetError("template: synthetic surfaces have no template (use kind='pcb' for pairs)")
    materials = settings.materials
    if materials is not None and (not materials or set(materials) - set(MATERIALS)):
        raise DefectDetError(
            f"materials: choose from {', '.join(MATERIALS)}; got {', '.join(materials) or 'none'}"
        )
    settings = settings.model_copy(
        update={
            "template": kind == "pcb" if settings.template is None else settings.template,
            "companions": tuple(checked_companion_names(list(settings.companions))),
            "shift": checked_shifts(settings.shift),
            "min_size": DEFAULT_SIZES[kind][0] if settings.min_size is None else settings.min_size,
            "max_size": DEFAULT_SIZES[kind][1] if settings.max_size is None else settings.max_size,
        }
    )
    _check_counts(settings.boards, settings.seed, settings.min_size, settings.max_size, settings.val_fraction)
    return settings


def _make_folders(out: Path, settings: SynthSettings) -> None:
    folders = ["images", "labels"] + (["templates"] if settings.template else [])
    folders += [f"companions/{name}" for name in settings.companions]
    for folder in folders:
        for split in ("train", "val"):
            (out / folder / split).mkdir(parents=True, exist_ok=True)


def _write_image(out: Path, settings: SynthSettings, splits: list[str], index: int) -> None:
    """Image `index`: its PNG, label file, template and companion captures."""
    split, seed, companions = splits[index], settings.seed, settings.companions
    image, boxes, classes, name, golden, clean = _generate(
        settings.kind,
        seed,
        index,
        (settings.min_size, settings.max_size),
        settings.color,
        settings.materials,
        bool(companions),
    )
    if settings.template and golden is not None:
        _write_png(out / "templates" / split / f"{name}.png", golden)
    if clean is not None:
        image = _write_companions(out / "companions", companions, split, name, image, clean, [seed, index])
    _write_png(out / "images" / split / f"{name}.png", image)
    (out / "labels" / split / f"{name}.txt").write_text(_label_lines(image, boxes, classes))


def _write_data_yaml(out: Path, settings: SynthSettings) -> Path:
    config: dict = {"path": ".", "train": "images/train", "val": "images/val"}
    if settings.template:
        config["templates"] = {"train": "templates/train", "val": "templates/val"}
    config.update(_companions_entry(settings.companions))
    config["names"] = list(SURFACE_CLASS_NAMES if settings.kind == "surface" else CLASS_NAMES)
    data_yaml = out / "data.yaml"
    data_yaml.write_text(yaml.safe_dump(config, sort_keys=False))
    return data_yaml


def _generate(
    kind: str,
    seed: int,
    index: int,
    sizes: tuple[int, int],
    color: bool | None,
    materials: tuple[str, ...] | None,
    clean: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, str, np.ndarray | None, np.ndarray | None]:
    """(image, boxes, classes, file stem, template (boards), the image without its defects (with `clean`))."""
    if kind == "surface":
        rgb = bool(color) if color is not None else _surface_is_color(seed, index)
        surface = generate_surface(seed, index, *sizes, rgb, materials or MATERIALS, clean=clean)
        return surface.image, surface.boxes, surface.classes, f"surface_{index:04d}", None, surface.clean
    board = generate_board(seed, index, *sizes, bool(color), clean=clean)
    return board.image, board.boxes, board.classes, f"board_{index:04d}", board.template, board.clean


def _write_companions(
    folder: Path,
    companions: tuple[str, ...],
    split: str,
    name: str,
    image: np.ndarray,
    clean: np.ndarray,
    seed: list[int],
) -> np.ndarray:
    """Write each companion capture of `image` (`folder/NAME/split/name.png`); returns the image with its defects
    faint, as its own lighting shows them."""
    for number, companion in enumerate(companions):
        capture = companion_capture(image, clean, np.random.default_rng([*seed, 0xC0, number]), number)
        _write_png(folder / companion / split / f"{name}.png", capture)
    return faint_defects(image, clean)


def _companions_entry(companions: tuple[str, ...]) -> dict:
    """data.yaml's `companions` entry (none without companions): one folder per companion and split."""
    if not companions:
        return {}
    return {
        "companions": {
            name: {"train": f"companions/{name}/train", "val": f"companions/{name}/val"}
            for name in companions
        }
    }


def _check_counts(boards: int, seed: int, min_size: int, max_size: int, val_fraction: float) -> None:
    if boards < 1:
        raise DefectDetError(f"boards: must be at least 1, got {boards}")
    if seed < 0:
        raise DefectDetError(f"seed: must be a non-negative integer, got {seed}")
    if not 32 <= min_size <= max_size:
        raise DefectDetError(f"min_size/max_size: need 32 <= min_size <= max_size, got {min_size}/{max_size}")
    if not 0.0 <= val_fraction < 1.0:
        raise DefectDetError(f"val_fraction: must be in [0, 1), got {val_fraction}")


def _run_each(work: Callable[[int], None], count: int, label: str | None) -> None:
    """work(0) .. work(count - 1), under a rich progress bar titled `label` unless it is None."""
    if label is None:
        for index in range(count):
            work(index)
        return
    from rich.progress import Progress

    with Progress(transient=False) as bar:
        task = bar.add_task(label, total=count)
        for index in range(count):
            work(index)
            bar.advance(task)


def _surface_is_color(seed: int, index: int) -> bool:
    return bool(np.random.default_rng([seed, index, 0xC0]).random() < SURFACE_COLOR_SHARE)
