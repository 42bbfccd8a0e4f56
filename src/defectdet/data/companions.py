"""Finding an image's companion captures by name, and keeping captures out of the images they accompany.

One rule for training data and `predict --companion`: a capture is the file of the image's relative path, name
or stem in the companion's folder, else the file whose name carries the companion's name as its capture tag
(`part_L1.png` -> `part_L2.png`, `part.png` -> `part_L2.png`), so both lightings may share one folder. A file
that is some image's companion is read with that image, never as an image of its own.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from pathlib import Path

from defectdet.data.imageio import IMAGE_SUFFIXES
from defectdet.data.sample import Problem, Sample

_TAGGED = re.compile(r"^(.+[_-])[A-Za-z][A-Za-z0-9]*$")  # stem = base + separator + capture tag (L1, uv, top)


def tagged_capture(image: Path, name: str, folder: Path) -> Path | None:
    """The file of ``image``'s stem with its capture tag replaced by ``name`` (``part_L1`` -> ``part_L2``), or with
    ``_name`` added (``part`` -> ``part_L2``), with any image suffix in ``folder``; never the image itself."""
    tagged = _TAGGED.match(image.stem)
    stems = ([tagged.group(1) + name] if tagged else []) + [f"{image.stem}_{name}"]
    for stem in stems:
        for candidate in sorted(folder.glob(f"{glob.escape(stem)}.*")):
            if candidate.suffix.lower() in IMAGE_SUFFIXES and not same_path(candidate, image):
                return candidate
    return None


def same_path(a: Path, b: Path) -> bool:
    """Whether `a` and `b` name one file (resolved; made absolute when a path cannot be resolved)."""
    return _resolved(a) == _resolved(b)


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return Path(os.path.normpath(path.absolute()))


def leave_out_companion_images(
    samples: Sequence[Sample], where: str, split: str
) -> tuple[list[Sample], list[Problem]]:
    """The samples whose image is no other sample's companion capture, and one warning with the count of those
    left out (a split folder holding both lightings lists each capture as an image too)."""
    captures = {_resolved(path) for sample in samples for path in sample.companion_paths.values()}
    kept = [sample for sample in samples if _resolved(sample.image_path) not in captures]
    left_out = len(samples) - len(kept)
    if not left_out:
        return kept, []
    message = (
        f"split '{split}': {left_out} listed image(s) are another image's companion capture; they are read with "
        "that image, not trained on as images of their own"
    )
    return kept, [Problem("warning", where, message)]
