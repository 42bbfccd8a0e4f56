"""The reviewed labels as one zip file, for the review page's download button. No torch import.

The zip is the review folder as a dataset: `data.yaml`, the image lists and logs at the top of the folder
(`reviewed.txt`, `decisions.jsonl`, the COCO export when written), and for every image that trains (accepted, or
decided clean) and whose label file reads: its image, its YOLO label file, its template and its companion
captures. Every other image is named in `left_out.txt` with the reason (an edit never accepted, skipped, not
reviewed, a label file that does not read). Unpacked, it trains with `train data.yaml --from`.

The zip is built in the review folder itself (a hidden `.download-*.zip.tmp`, deleted once sent), on the volume
that holds the images it packs: a small /tmp (a container's) never limits its size. One left by a crash is
deleted by the next download once it is an hour old.
"""

from __future__ import annotations

import os
import tempfile
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from defectdet.errors import DefectDetError
from defectdet.serve.capture import STALE_TEMPORARY_S

if TYPE_CHECKING:
    from defectdet.serve.review import ReviewFolder

TOP_LEVEL_SUFFIXES = (".yaml", ".txt", ".jsonl", ".json")


LEFT_OUT = "left_out.txt"
DOWNLOAD_PREFIX, DOWNLOAD_SUFFIX = ".download-", ".zip.tmp"


def trained_images(folder: ReviewFolder) -> tuple[list[Path], list[str]]:
    """The images that train (last decision accept or clean, a label file that reads), and one line
    `images/NAME: why` for every other image of the folder."""
    chosen, left_out = [], []
    folder.refresh_decisions()  # another process may have decided since
    for image in folder.images():
        reason = _left_out_reason(folder, image)
        if reason is None:
            chosen.append(image)
        else:
            left_out.append(f"{image.relative_to(folder.root).as_posix()}: {reason}")
    return chosen, left_out


def _left_out_reason(folder: ReviewFolder, image: Path) -> str | None:
    """Why `image` does not train, or None when it does."""
    from defectdet.serve.review import NOT_ACCEPTED, TRAINED

    decision = folder.decisions.get(image.name)
    try:
        labels = folder.read_labels(image)
    except (DefectDetError, OSError) as error:
        return f"left out: its label file does not read ({error})"
    if decision is None:
        return "left out: not reviewed" + (
            " (it has a label file: accept it to train on it)" if labels is not None else ""
        )
    if decision.action == "skip":
        return f"left out: skipped by {decision.operator or 'the operator'}"
    if decision.action not in TRAINED:
        return NOT_ACCEPTED
    return None if labels is not None else "left out: its label file is missing"


def write_dataset_zip(folder: ReviewFolder) -> tuple[Path, int]:
    """A temporary zip of the reviewed dataset (the caller deletes it) and the number of images in it. Images
    are stored as they are (already compressed); text files are deflated."""
    root = folder.root
    _remove_stale_downloads(root)
    handle, name = tempfile.mkstemp(prefix=DOWNLOAD_PREFIX, suffix=DOWNLOAD_SUFFIX, dir=root)
    os.close(handle)
    path = Path(name)
    images, left_out = trained_images(folder)
    try:
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for top in sorted(root.iterdir()):
                if top.is_file() and top.suffix in TOP_LEVEL_SUFFIXES and not top.name.startswith("."):
                    if top.name != LEFT_OUT:  # the folder's own file of that name would be out of date
                        archive.write(top, top.name)
            archive.writestr(LEFT_OUT, "".join(line + "\n" for line in left_out))
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


def _remove_stale_downloads(root: Path) -> None:
    """Delete the downloads a crash left behind (an hour old: one being sent now is younger)."""
    for path in root.glob(f"{DOWNLOAD_PREFIX}*{DOWNLOAD_SUFFIX}"):
        try:
            if time.time() - path.stat().st_mtime > STALE_TEMPORARY_S:
                path.unlink()
        except OSError:  # another process removed it meanwhile
            continue
