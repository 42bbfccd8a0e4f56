"""The reviewed labels as one zip file, for the review page's download button. No torch import.

The zip is the review folder as a dataset: `data.yaml`, the image lists and logs at the top of the folder
(`reviewed.txt`, `decisions.jsonl`, the COCO export when written), and for every labelled image that was not
skipped and whose label file reads: its image, its YOLO label file, its template and its companion captures. Unpacked, it trains with
`train data.yaml --from`.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from defectdet.errors import DefectDetError

if TYPE_CHECKING:
    from defectdet.serve.review import ReviewFolder

TOP_LEVEL_SUFFIXES = (".yaml", ".txt", ".jsonl", ".json")


def labelled_images(folder: ReviewFolder) -> list[Path]:
    """The images with a label file that reads, whose last decision is not skip (as the COCO export)."""
    chosen = []
    for image in folder.images():
        decision = folder.decisions.get(image.name)
        if decision is not None and decision.action == "skip":
            continue
        try:
            labels = folder.read_labels(image)
        except (DefectDetError, OSError):
            continue
        if labels is not None:
            chosen.append(image)
    return chosen


def write_dataset_zip(folder: ReviewFolder) -> tuple[Path, int]:
    """A temporary zip of the reviewed dataset (the caller deletes it) and the number of images in it. Images
    are stored as they are (already compressed); text files are deflated."""
    handle, name = tempfile.mkstemp(prefix="defectdet-review-", suffix=".zip")
    os.close(handle)
    path = Path(name)
    root = folder.root
    images = labelled_images(folder)
    try:
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for top in sorted(root.iterdir()):
                if top.is_file() and top.suffix in TOP_LEVEL_SUFFIXES and not top.name.startswith("."):
                    archive.write(top, top.name)
            for image in images:
                archive.write(image, image.relative_to(root).as_posix(), compress_type=zipfile.ZIP_STORED)
                label = folder.label_path(image)
                archive.write(label, label.relative_to(root).as_posix())
                planes = [folder.template_path(image)]
                planes += [folder.companion_path(image, name) for name in folder.companion_names()]
                for plane in planes:
                    if plane is not None and plane.is_relative_to(root):
                        archive.write(plane, plane.relative_to(root).as_posix(), zipfile.ZIP_STORED)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path, len(images)
