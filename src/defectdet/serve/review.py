"""Reviewing kept images (or any folder of images with optional YOLO labels): decisions become labels.

Layout of FOLDER: images in `FOLDER/images/` (or FOLDER itself), YOLO labels in `FOLDER/labels/NAME.txt`
(`class cx cy w h`, normalised), optional templates in `FOLDER/templates/`, optional companion captures in
`FOLDER/companions/CAPTURE/` (the same name as the image; the page can show each instead of the image) and the
model's predictions in `FOLDER/predictions/NAME.json` (what `serve --keep` writes). Decisions:

- `accept` / `edit`: the operator's boxes become `labels/NAME.txt` (accept after reviewing; edit is saved as
  each box is re-classed, deleted or drawn);
- `clean`: an empty label file (a defect-free example);
- `skip`: the image is dropped from the dataset; its label file, if any, is left as it is;
- `reset`: back to unreviewed: the label file is removed and the model's proposals are shown again;
- `undo`: takes back the image's last decision still in force (an accept made by a stray key, a reset, a clear):
  its label file is restored as it was before that decision (every decision logs it as `labels_before`) and the
  image's status is the one before. Several undos go back further; undo itself is not undone.

A decision can say `proposals_cleared`: the operator removed the model's proposals from the image; the listing
says so (`proposals_cleared`) until the image is reset or that decision undone, so reopening the page does not
bring them back.

Every image has a version, the number of decisions saved on it; a decision that names the version it was made
on is refused (409, nothing written) when another decision was saved on that image since (a second tab or
client). Every decision is written at once (label file through a temporary file and `os.replace`) and appended to
`FOLDER/decisions.jsonl` with the operator and the time; `FOLDER/reviewed.txt` (a YOLO image list) names the
images accepted or decided clean (an edit, boxes drawn but never accepted, is left out until it is accepted:
its unboxed defects would train as background), and `FOLDER/data.yaml` makes them a dataset for `train --from` (train: the older
images, `reviewed_train.txt`; val: the newest fifth by capture time, `reviewed_val.txt`; their templates and
companion captures). A label file
with a bad line is shown with the file and line and is never rewritten until the operator decides on that image.
A box that is empty inside its image is dropped with a note (`dropped` in the answer and the log) instead of
refusing the decision; the listing never serves an empty proposal. `GET /v1/review/download` is the reviewed
dataset as one zip (the images that train, and `left_out.txt`: every other image and why). `export_coco` writes the decided labels as COCO json.
The HTTP routes (`review_router`) are served by `defectdet serve --keep-dir` and `defectdet review`.
No torch import.
"""

from __future__ import annotations

import glob
import json
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, Response
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from defectdet.data.formats.interchange import CocoImage, coco_document
from defectdet.data.formats.yolo import fits_image_list, label_line
from defectdet.data.imageio import IMAGE_SUFFIXES, open_regular, read_image, read_image_size, read_text_file
from defectdet.errors import DefectDetError
from defectdet.serve.capture import COMPANIONS_DIR, DECISIONS, REVIEW_LOCK, atomic_write, folder_lock
from defectdet.serve.review_download import write_dataset_zip
from defectdet.serve.upload import UploadError, upload_name, visible_name

ACTIONS = ("accept", "edit", "clean", "skip", "reset", "undo")
LABELLED = frozenset({"accept", "edit", "clean"})
BOXED = frozenset({"accept", "edit"})  # the decisions that carry boxes
# the decisions that train: an edit has boxes drawn but was never accepted, so the defects it does not box yet
# would become background; it stays out of reviewed.txt, the download and the COCO export until accepted
TRAINED = frozenset({"accept", "clean"})
NOT_ACCEPTED = "left out: boxes drawn but never accepted (accept it, or decide clean, to train on it)"
STATIC_DIR = Path(__file__).resolve().parent / "static"
MAX_DECISION_BYTES = 1 << 20
MAX_BOXES = 1000
MAX_FILE_NAME_BYTES = 255  # the longest file name common file systems accept
REVIEWED = "reviewed.txt"
# data.yaml's splits: the newest share of the reviewed images (kept names sort by capture time) validates, so a
# fine-tune is measured on images of the line it has not trained on.
REVIEWED_TRAIN, REVIEWED_VAL = "reviewed_train.txt", "reviewed_val.txt"
HELD_OUT_SHARE = 0.2
DATA_YAML = "data.yaml"
CLASSES_FILE = "classes.txt"  # the class names, one per line, in id order
SIDECARS_FOR_ORDER = 50  # kept answers read to learn the companion captures' order
DATA_YAML_MARK = "# written by defectdet review: the reviewed images (reviewed.txt) as a dataset"
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
        "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class LabelFileError(DefectDetError):
    """A label file that does not parse: the message names the file and the line."""


@dataclass
class Box:
    """One labelled or predicted box in image pixels."""

    class_id: int
    box: tuple[float, float, float, float]
    score: float | None = None

    def to_dict(self, class_names: list[str]) -> dict[str, Any]:
        name = class_names[self.class_id] if 0 <= self.class_id < len(class_names) else str(self.class_id)
        answer: dict[str, Any] = {
            "class_id": self.class_id,
            "class_name": name,
            "box": [round(v, 2) for v in self.box],
        }
        if self.score is not None:
            answer["score"] = float(self.score)  # unrounded: the page compares it with the threshold
        return answer


@dataclass
class Decision:
    action: str
    operator: str
    time: str


@dataclass
class ReviewFolder:
    """A review folder on disk; thread-safe. `class_names`: None takes them from the sidecars or classes.txt."""

    root: Path
    class_names: list[str] | None = None
    operator: str = ""
    decisions: dict[str, Decision] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)  # image name -> decisions saved on it so far
    undoable: dict[str, str] = field(default_factory=dict)  # image name -> the decision an undo takes back
    cleared: set[str] = field(default_factory=set)  # images whose proposals the operator cleared
    broken: dict[str, str] = field(default_factory=dict)  # image name -> why it cannot be shown

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if not self.root.is_dir():
            raise DefectDetError(f"{self.root}: not a folder (review takes a folder of images)")
        self._lock = threading.Lock()  # one decision at a time in this process (with REVIEW_LOCK across them)
        # the decisions in memory and their mark: held while they are read or changed, never while waiting for
        # REVIEW_LOCK, so the listing answers while a decision waits for another process
        self._state = threading.RLock()
        self._sizes: dict[str, tuple[int, int]] = {}
        self._decisions_mark: tuple[int, int] | None = None
        self._companions: tuple[int, list[str]] | None = None  # (folder mark, names): read once per change
        self.refresh_decisions()
        if self.class_names is None:
            self.class_names = self._find_class_names()

    # ---------------------------------------------------------------- layout
    @property
    def image_dir(self) -> Path:
        images = self.root / "images"
        return images if images.is_dir() else self.root

    @property
    def label_dir(self) -> Path:
        return self.root / "labels"

    def images(self) -> list[Path]:
        """The images, sorted by name (kept items: oldest first). A name with a line break or other control
        character cannot be one line of reviewed.txt: it is left out (rename the file to review it)."""
        return sorted(
            path
            for path in self.image_dir.iterdir()
            if path.suffix.lower() in IMAGE_SUFFIXES
            and path.is_file()
            and not path.name.startswith(".")
            and fits_image_list(path.name)
        )

    def image_path(self, name: str) -> Path:
        """The image called `name` (a file name from the listing); 404 otherwise (no paths from the client)."""
        too_long = len(name.encode("utf-8", "replace")) > MAX_FILE_NAME_BYTES  # the OS would refuse it
        if too_long or "/" in name or "\\" in name or name.startswith(".") or not fits_image_list(name):
            raise UploadError(404, f"no image {name[:80]!r} in this folder")
        path = self.image_dir / name
        if path.suffix.lower() not in IMAGE_SUFFIXES or not path.is_file():
            raise UploadError(404, f"no image {name[:80]!r} in this folder")
        return path

    def label_path(self, image: Path) -> Path:
        return self.label_dir / f"{image.stem}.txt"

    def sidecar(self, image: Path) -> dict[str, Any] | None:
        path = self.root / "predictions" / f"{image.stem}.json"
        if not path.is_file():
            return None
        try:
            value = json.loads(read_text_file(path))
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def template_path(self, image: Path) -> Path | None:
        sidecar = self.sidecar(image) or {}
        named = sidecar.get("template")
        if isinstance(named, str) and "/" in named:
            candidate = self.root / "templates" / Path(named).name
            if candidate.is_file():
                return candidate
        folder = self.root / "templates"
        if folder.is_dir():
            for candidate in sorted(folder.glob(f"{image.stem}.*")):
                if candidate.suffix.lower() in IMAGE_SUFFIXES:
                    return candidate
        return None

    def companion_names(self) -> list[str]:
        """The companion captures of this folder (`companions/CAPTURE/`): in the order the kept answers list
        them (the model's plane order), then any other folder by name."""
        root = self.root / COMPANIONS_DIR
        try:
            mark = root.stat().st_mtime_ns  # a new capture folder changes it
        except OSError:
            return []
        if self._companions is not None and self._companions[0] == mark:
            return self._companions[1]
        found = sorted(
            path.name
            for path in root.iterdir()
            if path.is_dir() and not path.name.startswith(".") and fits_image_list(path.name)
        )
        ordered: list[str] = []
        predictions = self.root / "predictions"
        for path in sorted(predictions.glob("*.json"))[:SIDECARS_FOR_ORDER] if predictions.is_dir() else []:
            named = (self.sidecar(path) or {}).get("companions")  # the sidecar of the image of this stem
            if isinstance(named, dict) and named:
                ordered = [name for name in named if name in found]
                break
        names = ordered + [name for name in found if name not in ordered]
        if ordered or len(found) < 2:  # several captures and no sidecar yet: ask again for their order
            self._companions = (mark, names)
        return names

    def companion_path(self, image: Path, capture: str) -> Path | None:
        """The companion capture `capture` of `image`: the file its sidecar names, else the file of its stem in
        `companions/CAPTURE/`; None when there is none."""
        if capture not in self.companion_names():
            return None
        folder = self.root / COMPANIONS_DIR / capture
        named = ((self.sidecar(image) or {}).get("companions") or {}).get(capture)
        if isinstance(named, str) and (folder / Path(named).name).is_file():
            return folder / Path(named).name
        for candidate in sorted(folder.glob(f"{glob.escape(image.stem)}.*")):
            if candidate.suffix.lower() in IMAGE_SUFFIXES and candidate.is_file():
                return candidate
        return None

    def add_folder_classes(self) -> None:
        """Append the names of `classes.txt` that the class list lacks, after the model's classes, and then write
        the whole list to `classes.txt` (every later reader of the folder sees the same class ids): how an
        operator names real defect classes for a model that has none of them (a good-parts-only model's
        "anomaly"). Existing class ids never move."""
        path = self.root / CLASSES_FILE
        if self.class_names is None or not path.is_file():
            return
        try:
            names = [line.strip() for line in read_text_file(path).splitlines() if line.strip()]
        except (OSError, DefectDetError):
            return
        added = [name for name in dict.fromkeys(names) if name not in self.class_names]
        if added:
            self.class_names = self.class_names + added
            atomic_write(path, "".join(f"{name}\n" for name in self.class_names).encode())

    def _find_class_names(self) -> list[str]:
        """The kept answers' model classes (their ids are the sidecars'), else `classes.txt`, else "defect"."""
        predictions = self.root / "predictions"
        if predictions.is_dir():
            for path in sorted(predictions.glob("*.json")):
                try:
                    names = json.loads(read_text_file(path)).get("class_names")
                except (OSError, ValueError, AttributeError):
                    continue
                if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
                    return names
        classes = self.root / CLASSES_FILE
        if classes.is_file():
            names = [line.strip() for line in read_text_file(classes).splitlines() if line.strip()]
            if names:
                return names
        return ["defect"]

    def refresh_decisions(self) -> None:
        """Read decisions.jsonl again when it changed: another process (a `serve` worker or replica, or
        `defectdet review`) may have decided on images of this folder."""
        with self._state:
            mark = _file_mark(self.root / DECISIONS)
            if mark == self._decisions_mark:
                return
            stacks, versions = _replay(self._log_lines())
            decisions, undoable, cleared = {}, {}, set()
            for name, stack in stacks.items():
                decision, undo, proposals_cleared = _state_of(stack)
                if decision is not None:
                    decisions[name] = decision
                if undo is not None:
                    undoable[name] = undo
                if proposals_cleared:
                    cleared.add(name)
            self.decisions, self.undoable, self.cleared, self.versions = (
                decisions,
                undoable,
                cleared,
                versions,
            )
            self._decisions_mark = mark

    def _log_lines(self) -> list[str]:
        path = self.root / DECISIONS
        return read_text_file(path).splitlines() if path.is_file() else []

    # ---------------------------------------------------------------- reading
    def image_size(self, image: Path) -> tuple[int, int]:
        if image.name not in self._sizes:
            self._sizes[image.name] = read_image_size(image)
        return self._sizes[image.name]

    def read_labels(self, image: Path) -> list[Box] | None:
        """The label file's boxes in pixels; None when there is no label file; LabelFileError on a bad line."""
        path = self.label_path(image)
        if not path.is_file():
            return None
        width, height = self.image_size(image)
        shown = path.relative_to(self.root)
        boxes = []
        for number, line in enumerate(read_text_file(path).splitlines(), start=1):
            parts = line.split()
            if not parts:
                continue
            try:
                values = [float(part) for part in parts]
            except ValueError:
                values = []
            if len(parts) != 5 or len(values) != 5 or not all(math.isfinite(v) for v in values):
                raise LabelFileError(
                    f"{shown} line {number}: expected 'class cx cy w h' (5 numbers), got {line.strip()[:60]!r}"
                )
            class_id, cx, cy, w, h = values
            if class_id != int(class_id) or class_id < 0:
                raise LabelFileError(f"{shown} line {number}: class {parts[0]!r} is not a class index")
            if not (0 <= cx <= 1 and 0 <= cy <= 1 and 0 < w <= 1 and 0 < h <= 1):
                raise LabelFileError(
                    f"{shown} line {number}: centre and size must be normalised to [0, 1], got {line.strip()[:60]!r}"
                )
            box = ((cx - w / 2) * width, (cy - h / 2) * height, (cx + w / 2) * width, (cy + h / 2) * height)
            boxes.append(Box(int(class_id), box))
        return boxes

    def predictions(self, image: Path) -> list[Box]:
        sidecar = self.sidecar(image) or {}
        boxes = []
        for detection in sidecar.get("detections", []) or []:
            try:
                box = Box(
                    int(detection["class_id"]),
                    tuple(float(v) for v in detection["box"][:4]),
                    detection.get("score"),
                )
                x1, y1, x2, y2 = box.box
            except (KeyError, TypeError, ValueError):
                continue
            if x2 - x1 >= 1 and y2 - y1 >= 1:  # an empty proposal is never shown
                boxes.append(box)
        return boxes

    def item(self, image: Path) -> dict[str, Any]:
        """What the page shows for one image."""
        names = self.class_names or []
        entry: dict[str, Any] = {"name": image.name, "status": "pending", "error": None, "label_error": None}
        entry["version"] = self.versions.get(image.name, 0)
        entry["undoable"] = self.undoable.get(image.name)  # the decision an undo takes back
        entry["proposals_cleared"] = image.name in self.cleared
        decision = self.decisions.get(image.name)
        if decision is not None:
            entry.update(status=decision.action, operator=decision.operator, decided=decision.time)
        sidecar = self.sidecar(image) or {}
        entry["reasons"] = sidecar.get("reasons", [])
        entry["upload_name"] = upload_name(sidecar.get("upload_name"))  # the client's file name: the part
        entry["captured"] = _capture_time(sidecar.get("time"))
        entry["verdict"] = sidecar.get("verdict")
        entry["threshold"] = sidecar.get("threshold", sidecar.get("stored_threshold"))
        entry["template"] = self.template_path(image) is not None
        entry["companions"] = [
            name for name in self.companion_names() if self.companion_path(image, name) is not None
        ]
        entry["predictions"] = [box.to_dict(names) for box in self.predictions(image)]
        if image.name in self.broken:
            entry["error"] = self.broken[image.name]
            entry["boxes"] = []
            return entry
        try:
            entry["size"] = list(self.image_size(image))
        except (DefectDetError, OSError) as error:
            entry["error"] = str(error)
            entry["boxes"] = []
            return entry
        try:
            labels = self.read_labels(image)
        except LabelFileError as error:
            entry["label_error"] = str(error)
            labels = None
        except OSError as error:
            entry["label_error"] = (
                f"{self.label_path(image).relative_to(self.root)}: {error.strerror or error}"
            )
            labels = None
        if labels is not None and decision is None:
            entry["status"] = "labelled"
        entry["has_labels"] = labels is not None
        entry["boxes"] = (
            [box.to_dict(names) for box in labels] if labels is not None else entry["predictions"]
        )
        return entry

    def listing(self) -> dict[str, Any]:
        self.add_folder_classes()
        self.refresh_decisions()
        items = [self.item(image) for image in self.images()]
        # by capture time, then the name the part was uploaded as (the ones kept in one second in the line's
        # order), then the file name; images without a capture time first, by file name
        items.sort(key=lambda entry: (entry["captured"] or "", entry["upload_name"] or "", entry["name"]))
        counts: dict[str, int] = {"items": len(items), "broken": 0, "label_errors": 0}
        for entry in items:
            counts[entry["status"]] = counts.get(entry["status"], 0) + 1
            counts["broken"] += entry["error"] is not None
            counts["label_errors"] += entry["label_error"] is not None
        return {
            "folder": self.root.name,
            "class_names": self.class_names,
            "operator": self.operator,
            "items": items,
            "counts": counts,
        }

    def render(self, image: Path, plane: bool = False) -> bytes:
        """The image as PNG for the browser (any accepted format, EXIF rotation applied); a decode failure
        marks it broken (shown and counted on the page) and answers 422. `plane`: a template or companion
        capture of an image, answered 422 when it fails without marking the image."""
        try:
            array = read_image(image, channels=3)
            ok, encoded = cv2.imencode(".png", cv2.cvtColor(array, cv2.COLOR_RGB2BGR))
            if not ok:
                raise DefectDetError(f"{image.name}: could not be re-encoded for the page")
        except (DefectDetError, OSError, cv2.error, MemoryError) as error:
            reason = " ".join(str(error).split()) or type(error).__name__
            if not plane:
                self.broken[image.name] = reason
            raise UploadError(422, f"{image.name}: {reason}") from None
        if not plane:
            self._sizes[image.name] = (array.shape[1], array.shape[0])
        return encoded.tobytes()

    # ---------------------------------------------------------------- deciding
    def decide(
        self,
        name: str,
        action: str,
        boxes: Any = None,
        operator: str | None = None,
        version: Any = None,
        proposals_cleared: Any = False,
    ) -> dict[str, Any]:
        """Save one decision on image `name` (label file and log); the updated item. UploadError on bad input.
        `version`: the image's version the decision was made on (the listing's `version`); when another
        decision was saved on the image since, nothing is written and the answer is 409. None skips the check.
        `proposals_cleared`: the operator removed the model's proposals (not with reset or undo)."""
        image = self.image_path(name)
        self.add_folder_classes()
        if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 0):
            raise UploadError(422, f"version must be a whole number >= 0 (the listing's), got {version!r}")
        if action not in ACTIONS:
            raise UploadError(422, f"action must be one of {', '.join(ACTIONS)}, got {str(action)[:30]!r}")
        if proposals_cleared not in (None, False, True) or (
            proposals_cleared and action in ("reset", "undo")
        ):
            raise UploadError(
                422, "proposals_cleared is true or false, and goes with accept, edit, clean or skip"
            )
        who = visible_name(operator or self.operator or "")  # no ESC, no U+202E in decisions.jsonl
        if not who:
            raise UploadError(422, "name the operator: the page's name field or review --operator NAME")
        parsed: list[Box] = []
        dropped: list[str] = []
        if image.name in self.broken:
            if action in LABELLED:
                raise UploadError(
                    422, f"{image.name} cannot be decoded ({self.broken[image.name]}): only skip"
                )
        else:
            try:
                size = self.image_size(image)
            except (DefectDetError, OSError) as error:
                if action in LABELLED:
                    raise UploadError(422, f"{image.name}: {error}") from None
                size = (1, 1)
            if action in BOXED:
                parsed, dropped = self._parse_boxes(boxes, size)
        with self._lock, folder_lock(self.root / REVIEW_LOCK):  # the keep cap deletes under it too
            if not image.is_file():  # deleted by the keep folder's cap meanwhile: label nothing
                raise UploadError(
                    404, f"no image {name[:80]!r} in this folder (the keep folder's cap deleted it)"
                )
            with self._state:
                self.refresh_decisions()  # what the other processes decided goes into reviewed.txt too
                self._check_version(image.name, version)
                answer = self._save(image, action, (parsed, dropped), who, bool(proposals_cleared))
        answer["dropped"] = dropped
        return answer

    def _save(
        self, image: Path, action: str, boxes: tuple[list[Box], list[str]], who: str, cleared: bool
    ) -> dict[str, Any]:
        """Write one checked decision (label file, then its log line) and update the state in memory; under
        both locks. `boxes`: the boxes and the notes on those dropped. Every decision but undo logs the label
        file as it was (`labels_before`) for undo."""
        parsed, dropped = boxes
        label = self.label_path(image)
        shown = label.relative_to(self.root).as_posix()
        before = _label_text(label, shown)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        entry: dict[str, Any] = {"time": stamp, "operator": who, "image": str(image.relative_to(self.root))}
        entry["action"] = action
        if action == "undo":
            stack = self._in_force(image.name)
            undone = stack.pop()
            _put_labels(label, undone["labels_before"])
            entry["undid"] = {key: undone.get(key) for key in ("action", "operator", "time")}
            entry["labels"] = shown if undone["labels_before"] is not None else None
            state = _state_of(stack)
        else:
            if action == "reset":
                label.unlink(missing_ok=True)
            elif action in LABELLED:
                width, height = self.image_size(image)
                lines = "".join(label_line(box.class_id, box.box, width, height) + "\n" for box in parsed)
                _put_labels(label, lines)
            entry["boxes"] = [box.to_dict(self.class_names or []) for box in parsed]
            entry["labels"] = shown if action in LABELLED else None
            entry["labels_before"] = before
            if dropped:
                entry["dropped"] = dropped
            if cleared:
                entry["proposals_cleared"] = True
            kept_clear = action != "reset" and (cleared or image.name in self.cleared)
            state = (None if action == "reset" else Decision(action, who, stamp), action, kept_clear)
        _append_line(self.root / DECISIONS, json.dumps(entry))
        decision, undo, kept_clear = state
        self.decisions.pop(image.name, None)
        self.undoable.pop(image.name, None)
        self.cleared.discard(image.name)
        if decision is not None:
            self.decisions[image.name] = decision
        if undo is not None:
            self.undoable[image.name] = undo
        if kept_clear:
            self.cleared.add(image.name)
        self.versions[image.name] = self.versions.get(image.name, 0) + 1
        self._decisions_mark = _file_mark(self.root / DECISIONS)  # our own line: nothing to read again
        self._write_reviewed()
        return self.item(image)

    def _in_force(self, name: str) -> list[dict[str, Any]]:
        """The decisions on `name` still in force (oldest first), read from the log; 409 when the last one
        cannot be undone (there is none, or it was logged without the labels before it)."""
        stack = _replay(self._log_lines())[0].get(name, [])
        if not stack:
            raise UploadError(409, f"{name}: nothing to undo, no decision on it is in force")
        before = stack[-1].get("labels_before", False)
        if before is not None and not isinstance(before, str):
            raise UploadError(
                409,
                f"{name}: its last decision ({stack[-1].get('action')}) cannot be undone: it was saved "
                "without the labels before it; decide again instead",
            )
        return stack

    def _check_version(self, name: str, version: int | None) -> None:
        """409 when `version` is not the image's current version: another decision (another tab, another
        client) was saved on it after the sender read it."""
        current = self.versions.get(name, 0)
        if version is None or version == current:
            return
        last = self.decisions.get(name)
        by = f" ({last.action} by {last.operator or 'someone'} at {last.time})" if last else ""
        raise UploadError(
            409,
            f"{name} changed since you opened it: version {version} was read, version {current} is saved"
            f"{by}; nothing was written, reload the image and decide again",
        )

    def _parse_boxes(self, boxes: Any, size: tuple[int, int]) -> tuple[list[Box], list[str]]:
        """The boxes, and a note for each empty one dropped (an empty box never blocks the others)."""
        if not isinstance(boxes, list):
            raise UploadError(422, "boxes must be a list of {class_id, box: [x1, y1, x2, y2]}")
        if len(boxes) > MAX_BOXES:
            raise UploadError(422, f"at most {MAX_BOXES} boxes per image, got {len(boxes)}")
        width, height = size
        classes = len(self.class_names or [])
        parsed, dropped = [], []
        for index, value in enumerate(boxes):
            where = f"boxes[{index}]"
            if not isinstance(value, dict):
                raise UploadError(422, f"{where}: expected an object with class_id and box")
            class_id = value.get("class_id")
            if not isinstance(class_id, int) or isinstance(class_id, bool) or not 0 <= class_id < classes:
                raise UploadError(
                    422, f"{where}.class_id must be an integer in [0, {classes - 1}], got {class_id!r}"
                )
            coords = value.get("box")
            if (
                not isinstance(coords, list)
                or len(coords) != 4
                or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                    for v in coords
                )
            ):
                raise UploadError(422, f"{where}.box must be 4 finite numbers [x1, y1, x2, y2] in pixels")
            x1, y1, x2, y2 = (float(v) for v in coords)
            x1, x2 = sorted((min(max(x1, 0.0), width), min(max(x2, 0.0), width)))
            y1, y2 = sorted((min(max(y1, 0.0), height), min(max(y2, 0.0), height)))
            if x2 - x1 < 1 or y2 - y1 < 1:
                dropped.append(f"{where}: dropped, the box is empty inside the {width}x{height} image")
                continue
            parsed.append(Box(class_id, (x1, y1, x2, y2)))
        return parsed, dropped

    def _write_reviewed(self) -> None:
        lines = [
            f"./{image.relative_to(self.root)}\n"
            for image in self.images()
            if self.decisions.get(image.name, Decision("", "", "")).action in TRAINED
        ]
        atomic_write(self.root / REVIEWED, "".join(lines).encode())
        held = held_out_count(len(lines))
        train, val = (lines[: len(lines) - held], lines[len(lines) - held :]) if held else (lines, lines)
        atomic_write(self.root / REVIEWED_TRAIN, "".join(train).encode())
        atomic_write(self.root / REVIEWED_VAL, "".join(val).encode())
        self._write_data_yaml()

    def _write_data_yaml(self) -> None:
        """`data.yaml` for `train FOLDER/data.yaml --from MODEL`: the reviewed images split by capture time
        (train: the older ones, val: the newest `HELD_OUT_SHARE`, the held-out images `compare` measures on),
        their templates, the class names. A data.yaml this class did not write is left alone."""
        path = self.root / DATA_YAML
        if path.exists() and not read_text_file(path).startswith(DATA_YAML_MARK):
            return
        lines = [DATA_YAML_MARK, "path: .", f"train: {REVIEWED_TRAIN}", f"val: {REVIEWED_VAL}"]
        if (self.root / "templates").is_dir():
            lines.append("templates: templates")
        companions = self.companion_names()
        if companions:
            lines.append("companions:")
            lines += [f"  {name}: {COMPANIONS_DIR}/{name}" for name in companions]
        lines.append("names:")
        lines += [f"  {index}: {json.dumps(name)}" for index, name in enumerate(self.class_names or [])]
        atomic_write(path, ("\n".join(lines) + "\n").encode())

    # ---------------------------------------------------------------- export
    def export_coco(self, out: str | Path) -> dict[str, Any]:
        """COCO json of the labelled images (accepted or clean, or with a hand-made label file and no
        decision). Images whose label file has a bad line or that cannot be read, and edits never accepted, are
        left out and listed."""
        out = Path(out)
        if out.is_dir():
            raise DefectDetError(
                f"{out}: a folder; the COCO export is one json file (e.g. {out / 'annotations.coco.json'})"
            )
        names = self.class_names or []
        entries: list[CocoImage] = []
        problems: list[str] = []
        self.refresh_decisions()
        base = out.resolve().parent  # the export's paths are relative to its folder
        for image in self.images():
            entry = self._coco_image(image, base, names, problems)
            if entry is not None:
                entries.append(entry)
        document = coco_document(entries, names, f"{self.root}: reviewed images, exported by defectdet")
        images, annotations = document["images"], document["annotations"]
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(out, json.dumps(document, indent=1).encode())
        except OSError as error:
            raise DefectDetError(f"{out}: cannot write the COCO export ({error.strerror or error})") from None
        return {
            "path": str(out),
            "images": len(images),
            "annotations": len(annotations),
            "problems": problems,
        }

    def _coco_image(self, image: Path, base: Path, names: list[str], problems: list[str]) -> CocoImage | None:
        """One image of the COCO export, its paths relative to `base`; None (and why in `problems`, unless
        skipped or unlabelled) when it is left out."""
        decision = self.decisions.get(image.name)
        if decision is not None and decision.action == "skip":
            return None
        if decision is not None and decision.action not in TRAINED:
            problems.append(f"{image.relative_to(self.root)}: {NOT_ACCEPTED}")
            return None
        try:
            labels = self.read_labels(image)
            width, height = self.image_size(image)
        except (DefectDetError, OSError) as error:
            problems.append(str(error))
            return None
        if labels is None:
            return None
        named = [box for box in labels if box.class_id < len(names)]
        problems += [
            f"{self.label_path(image).relative_to(self.root)}: class {box.class_id} unnamed"
            for box in labels
            if box.class_id >= len(names)
        ]
        relative = _relative_posix(image, base)
        boxes = [box.box for box in named]
        template = self.template_path(image)  # as COCO's image-level template_file_name
        template_name = None if template is None else _relative_posix(template, base)
        classes = [box.class_id for box in named]
        companions = {
            name: _relative_posix(path, base)
            for name in self.companion_names()
            if (path := self.companion_path(image, name)) is not None
        }  # as COCO's image-level companions
        return CocoImage(relative, width, height, boxes, classes, template_name, companions)


def _relative_posix(path: Path, base: Path) -> str:
    """`path` (resolved) relative to the folder `base`, with forward slashes."""
    return Path(os.path.relpath(path.resolve(), base)).as_posix()


def _capture_time(value: Any) -> str | None:
    """A sidecar's capture time (seconds since the epoch) as `2026-12-07T21:15:07Z`; None when it is none."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 253402300800:
        return None  # not a time, or past the year 9999
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(value))


def held_out_count(reviewed: int) -> int:
    """How many of `reviewed` images validate: `HELD_OUT_SHARE` of them, at least one from two images on;
    none of a single image (train and val are then that image)."""
    return max(1, round(reviewed * HELD_OUT_SHARE)) if reviewed >= 2 else 0


def _replay(lines: list[str]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
    """From the log's lines: each image's decisions in force, oldest first (a decision is added, an `undo` takes
    the last one off), and each image's version (its number of lines). Lines that do not read are passed over (a
    torn last line after a crash: the label files are the truth)."""
    stacks: dict[str, list[dict[str, Any]]] = {}
    versions: dict[str, int] = {}
    for line in lines:
        try:
            entry = json.loads(line)
            name, action = Path(entry["image"]).name, entry["action"]
        except (ValueError, KeyError, TypeError):
            continue
        if not isinstance(action, str):
            continue
        versions[name] = versions.get(name, 0) + 1
        stack = stacks.setdefault(name, [])
        if action != "undo":
            stack.append(entry)
        elif stack:
            stack.pop()
    return stacks, versions


def _state_of(stack: list[dict[str, Any]]) -> tuple[Decision | None, str | None, bool]:
    """An image's decision (None: unreviewed), the decision an undo takes back (None: nothing) and whether its
    proposals are cleared, from its decisions in force."""
    if not stack:
        return None, None, False
    top = stack[-1]
    before = top.get("labels_before", False)
    undo = str(top["action"]) if before is None or isinstance(before, str) else None
    decision = None
    if top["action"] != "reset":
        decision = Decision(str(top["action"]), str(top.get("operator", "")), str(top.get("time", "")))
    cleared = False
    for entry in reversed(stack):  # cleared until a reset
        if entry["action"] == "reset":
            break
        if entry.get("proposals_cleared") is True:
            cleared = True
            break
    return decision, undo, cleared


def _label_text(path: Path, shown: str) -> str | None:
    """The label file's exact content (bytes that are not UTF-8 kept as surrogate escapes), None without one."""
    try:
        with open_regular(path) as handle:
            return handle.read().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return None
    except OSError as error:
        raise UploadError(
            422, f"{shown} cannot be read ({error.strerror or error}); nothing was written"
        ) from None


def _put_labels(path: Path, text: str | None) -> None:
    """Write the label file atomically (None removes it)."""
    if text is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text.encode("utf-8", "surrogateescape"))


def _file_mark(path: Path) -> tuple[int, int] | None:
    """(size, mtime) of `path`, None when it cannot be read: how a change by another process is noticed."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns


def _append_line(path: Path, line: str) -> None:
    """One whole line per write on an O_APPEND descriptor, synced: a crash can only tear the last line."""
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, (line + "\n").encode())
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


async def _json_body(request: Request) -> dict[str, Any]:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_DECISION_BYTES:
            raise UploadError(413, f"a decision is at most {MAX_DECISION_BYTES} bytes")
    try:
        value = json.loads(bytes(body) or b"{}")
    except ValueError as error:
        raise UploadError(400, f"the body is not JSON ({error})") from None
    except RecursionError:
        raise UploadError(400, "the JSON body nests too deep") from None
    if not isinstance(value, dict):
        raise UploadError(422, "the body must be a JSON object")
    return value


def review_router(folder: ReviewFolder, export_name: str = "annotations.coco.json") -> APIRouter:
    """The page at /review and its API under /v1/review/ (POSTs go through the service's guard). The file work
    (and the wait for another process's decision) runs in worker threads, never on the event loop: a held
    folder lock never stalls /healthz or the other requests."""
    router = APIRouter()

    @router.get("/review", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "review.html", media_type="text/html", headers=PAGE_HEADERS)

    @router.get("/v1/review/items", summary="The review folder: items, their boxes and status")
    def items() -> dict[str, Any]:
        return folder.listing()

    _add_image_routes(router, folder)
    _add_decision_routes(router, folder, export_name)
    return router


def _add_image_routes(router: APIRouter, folder: ReviewFolder) -> None:
    """GET an image, its template or one of its companion captures as PNG."""

    @router.get("/v1/review/image/{name}", summary="One image as PNG")
    def image(
        name: str = PathParam(description="the image's file name, as /v1/review/items lists it"),
    ) -> Response:
        return Response(folder.render(folder.image_path(name)), media_type="image/png")

    @router.get("/v1/review/template/{name}", summary="The template of one image as PNG")
    def template(
        name: str = PathParam(description="the image's file name, as /v1/review/items lists it"),
    ) -> Response:
        path = folder.template_path(folder.image_path(name))
        if path is None:
            raise UploadError(404, f"{name[:80]} has no template")
        return Response(folder.render(path, plane=True), media_type="image/png")

    @router.get("/v1/review/companion/{capture}/{name}", summary="A companion capture of one image as PNG")
    def companion(
        capture: str = PathParam(description="the companion capture, as /v1/review/items lists it (e.g. L2)"),
        name: str = PathParam(description="the image's file name, as /v1/review/items lists it"),
    ) -> Response:
        path = folder.companion_path(folder.image_path(name), capture)
        if path is None:
            raise UploadError(404, f"{name[:80]} has no companion capture {capture[:40]!r}")
        return Response(folder.render(path, plane=True), media_type="image/png")


def _add_decision_routes(router: APIRouter, folder: ReviewFolder, export_name: str) -> None:
    """POST a decision or an export; GET the reviewed dataset as a zip."""

    @router.post("/v1/review/decide", summary="Save a decision: accept, edit, clean, skip, reset or undo")
    async def decide(request: Request) -> dict[str, Any]:
        body = await _json_body(request)
        name = body.get("image")
        if not isinstance(name, str):
            raise UploadError(422, "image: the image's file name (from /v1/review/items)")
        return await run_in_threadpool(
            folder.decide,
            name,
            str(body.get("action")),
            body.get("boxes"),
            body.get("operator"),
            body.get("version"),
            body.get("proposals_cleared", False),
        )

    @router.post("/v1/review/export", summary="Write the labels as COCO json in the folder")
    async def export(request: Request) -> dict[str, Any]:
        await _json_body(request)
        summary = await run_in_threadpool(folder.export_coco, folder.root / export_name)
        summary["path"] = export_name
        summary["download"] = "/v1/review/download"
        return summary

    @router.get("/v1/review/download", summary="The reviewed dataset as a zip (data.yaml, images, labels)")
    def download() -> FileResponse:
        path, _ = write_dataset_zip(folder)
        name = f"{folder.root.name or 'review'}-labels.zip"
        return FileResponse(
            path, media_type="application/zip", filename=name, background=BackgroundTask(path.unlink)
        )
