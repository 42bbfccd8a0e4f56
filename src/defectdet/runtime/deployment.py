"""Which bundle answers, which one runs beside it, and which one came before (`serve --models-dir`).

A candidate bundle is copied into the models folder (by hand, scp, or from the fine-tune run's export).
`POST /v1/models/shadow` runs it beside the live model on every answered image: its answers are never
returned, only compared with the live ones (`disagreement`), and the rate shows in /metrics and
/v1/models. `POST /v1/models/promote` makes it the live model; `POST /v1/models/rollback` brings the
previous one back.

A swap is one reference assignment: a request takes the live model once, when its inference starts, and
finishes on it, so no request is dropped or answered by half of each model. Promotion also rewrites the
bundle file `serve` was started with (atomically; the bytes it held are archived first under
`<models-dir>/previous/`), so a restart serves what was promoted and a roll-back works after a restart too.
Every promotion and roll-back is one line in `<models-dir>/promotions.jsonl`. No torch import.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from defectdet.errors import DefectDetError
from defectdet.runtime.model_quality import validation_quality
from defectdet.runtime.monitor import DriftMonitor
from defectdet.runtime.upload import UploadError

logger = logging.getLogger(__name__)

PREVIOUS_DIR = "previous"
HISTORY_FILE = "promotions.jsonl"
MATCH_IOU = 0.5
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}\.onnx$")
_PRINTABLE = re.compile(r"[^\x20-\x7e]")


def bundle_sha256(predictor: Any) -> str:
    """sha256 (hex) of the bundle file when there is one, else of its metadata; its first 12 hex digits are
    the model version."""
    path = getattr(predictor, "path", None)
    if path is not None and Path(path).is_file():
        return file_sha256(Path(path))
    return hashlib.sha256(predictor.metadata.to_json().encode()).hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class ServedModel:
    """A loaded bundle and its drift charts. `source`: a file that holds its bytes (None: in memory only)."""

    predictor: Any
    sha256: str
    name: str
    source: Path | None
    since: float
    monitor: DriftMonitor | None

    @classmethod
    def of(cls, predictor: Any, source: Path | None = None, sha256: str | None = None) -> ServedModel:
        """`sha256`: the bundle's hash when the caller already read it (else hashed here)."""
        path = getattr(predictor, "path", None)
        source = source or (Path(path) if path is not None else None)
        reference = predictor.metadata.drift_reference
        return cls(
            predictor=predictor,
            sha256=sha256 or bundle_sha256(predictor),
            name=source.name if source is not None else "in-memory",
            source=source,
            since=time.time(),
            monitor=DriftMonitor(reference) if reference else None,
        )

    @property
    def metadata(self) -> Any:
        return self.predictor.metadata

    @property
    def version(self) -> str:
        return self.sha256[:12]

    def describe(self) -> dict[str, Any]:
        meta = self.metadata
        return {
            "name": self.name,
            "model_version": self.version,
            "sha256": self.sha256,
            "since": _iso(self.since),
            "preset": meta.preset,
            "class_names": list(meta.class_names),
            "threshold": meta.thresholds.score,
            "precision": meta.precision,
            "input_size": meta.input_size,
            "flip_views": meta.flip_views,  # test-time flips in the graph: they multiply the model's time
            "repeat_check": meta.repeat_check,  # detections on repeated design dropped (runtime.repeat_check)
            "quality": validation_quality(meta),  # near-zero validation mAP flagged
        }


def disagreement(live: Any, shadow: Any, iou: float = MATCH_IOU) -> list[str]:
    """How two answers on one image differ, each at its own verdict threshold: "verdict" when one calls the
    image defective and the other clean; "boxes" when a detection of either has no detection of the same
    class name in the other at IoU >= `iou`. [] when they agree."""
    kinds = []
    if live.verdict != shadow.verdict:
        kinds.append("verdict")
    ours = [d for d in live.detections if d.score >= live.threshold]
    theirs = [d for d in shadow.detections if d.score >= shadow.threshold]
    if _unmatched(ours, theirs, iou) or _unmatched(theirs, ours, iou):
        kinds.append("boxes")
    return kinds


def _unmatched(first: list[Any], second: list[Any], iou: float) -> bool:
    """True when some detection of `first` has no same-class detection in `second` at IoU >= iou."""
    for detection in first:
        if not any(
            other.class_name == detection.class_name and _iou(detection.box, other.box) >= iou
            for other in second
        ):
            return True
    return False


def _iou(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


class ShadowRun:
    """A candidate answering beside the live model on one worker thread of its own. At most `max_pending`
    images wait for it; beyond that an image is skipped (counted), so the shadow never holds up live answers.
    The rate is over the last `window` compared images."""

    def __init__(self, model: ServedModel, metrics: Any, max_pending: int = 2, window: int = 500) -> None:
        self.model = model
        self.metrics = metrics
        self.max_pending = max_pending
        self.started = time.time()
        self.images = 0
        self.kinds: Counter[str] = Counter()
        self.skipped = 0
        self.errors = 0
        self.recent: deque[bool] = deque(maxlen=window)
        self.examples: deque[dict[str, Any]] = deque(maxlen=20)
        self._pending = 0
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="defectdet-shadow")

    def submit(self, image: np.ndarray, template: np.ndarray | None, live_result: Any) -> None:
        with self._lock:
            if self._pending >= self.max_pending:
                self.skipped += 1
                self.metrics.shadow_skipped.inc()
                return
            self._pending += 1
        try:
            self._executor.submit(self._compare, image, template, live_result)
        except RuntimeError:  # stopped meanwhile
            with self._lock:
                self._pending -= 1

    def _compare(self, image: np.ndarray, template: np.ndarray | None, live_result: Any) -> None:
        try:
            answer = self.model.predictor.predict(image, template=template)
            kinds = disagreement(live_result, answer)
        except Exception as error:  # a candidate that fails on an image is reported, never raised
            logger.warning("shadow %s failed on an image: %s", self.model.name, error)
            with self._lock:
                self.errors += 1
            self.metrics.shadow_errors.inc()
            return
        finally:
            with self._lock:
                self._pending -= 1
        with self._lock:
            self.images += 1
            self.recent.append(bool(kinds))
            self.kinds.update(kinds)
            if kinds:
                self.examples.appendleft(
                    {
                        "time": _iso(time.time()),
                        "kinds": kinds,
                        "live": _brief(live_result),
                        "shadow": _brief(answer),
                    }
                )
            rate = sum(self.recent) / len(self.recent)
        self.metrics.observe_shadow(kinds, rate)

    def report(self) -> dict[str, Any]:
        with self._lock:
            compared = len(self.recent)
            return {
                **self.model.describe(),
                "shadow_since": _iso(self.started),
                "images": self.images,
                "disagreements": {"any": sum(self.recent), "window": compared, **dict(self.kinds)},
                "disagreement_rate": sum(self.recent) / compared if compared else None,
                "skipped_busy": self.skipped,
                "errors": self.errors,
                "recent_disagreements": list(self.examples),
            }

    def wait(self, timeout_s: float = 30.0) -> bool:
        """True once no image waits for the shadow (tests, and the walk in the test suite)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._pending == 0:
                    return True
            time.sleep(0.01)
        return False

    def stop(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class Deployment:
    """The live model, an optional shadow and the previous model; changes one at a time (409 while one runs).

    `load(path)` builds a predictor for a bundle file (the server passes its threads and pixel limit);
    `on_swap(model)` runs after the live model changed (the server resets the drift metrics to its charts).
    """

    def __init__(
        self,
        live: ServedModel,
        metrics: Any,
        *,
        models_dir: str | Path | None = None,
        live_path: Path | None = None,
        load: Callable[[Path], Any] | None = None,
        on_swap: Callable[[ServedModel], None] | None = None,
    ) -> None:
        self.live = live
        self.metrics = metrics
        self.models_dir = Path(models_dir) if models_dir is not None else None
        self.live_path = live_path
        self.load = load
        self.on_swap = on_swap
        self.shadow: ShadowRun | None = None
        self.previous: ServedModel | None = None  # loaded, for a fast roll-back (this process only)
        self.previous_file: Path | None = None  # its archived bytes (survive a restart)
        self._changing = threading.Lock()
        if self.models_dir is not None:
            (self.models_dir / PREVIOUS_DIR).mkdir(parents=True, exist_ok=True)
            self.previous_file = self._previous_from_history()
        self.metrics.set_models(self)

    # ------------------------------------------------------------------ reading
    def report(self) -> dict[str, Any]:
        shadow = self.shadow
        previous = self.previous.describe() if self.previous is not None else None
        if previous is None and self.previous_file is not None:
            previous = {
                "name": self.previous_file.name,
                "file": _relative(self.previous_file, self.models_dir),
            }
        return {
            "live": self.live.describe(),
            "shadow": shadow.report() if shadow is not None else None,
            "previous": previous,
            "models_dir": self.models_dir is not None,
            "candidates": self.candidates(),
            "history": self.history(limit=20),
        }

    def candidates(self) -> list[dict[str, Any]]:
        """The bundle files in the models folder (names only: the folder's path is not shown)."""
        if self.models_dir is None:
            return []
        found = []
        for path in sorted(self.models_dir.glob("*.onnx")):
            if path.is_file() and _NAME.match(path.name):
                stat = path.stat()
                found.append({"name": path.name, "bytes": stat.st_size, "modified": _iso(stat.st_mtime)})
        return found

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Promotions and roll-backs, newest first (lines that do not parse are skipped with a warning)."""
        if self.models_dir is None or not (self.models_dir / HISTORY_FILE).is_file():
            return []
        records = []
        for number, line in enumerate((self.models_dir / HISTORY_FILE).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                logger.warning("%s line %d: not JSON; skipped", self.models_dir / HISTORY_FILE, number)
        records.reverse()
        return records[:limit] if limit else records

    # ------------------------------------------------------------------ shadow
    def observe(self, image: np.ndarray, template: np.ndarray | None, live_result: Any) -> None:
        """Hand one answered image to the shadow, if one runs (never raises, never waits)."""
        shadow = self.shadow
        if shadow is not None:
            shadow.submit(image, template, live_result)

    def start_shadow(self, name: str) -> dict[str, Any]:
        with self._change():
            path = self.resolve(name)
            sha = file_sha256(path)
            if sha == self.live.sha256:
                raise UploadError(409, f"{name} is the live model's bundle: nothing to compare it with")
            model = self._load(path, sha)
            old, self.shadow = self.shadow, ShadowRun(model, self.metrics)
            if old is not None:
                old.stop()
            self.metrics.set_models(self)
            logger.info("shadow: %s (%s) runs beside %s", model.name, model.version, self.live.name)
            return self.report()

    def stop_shadow(self) -> dict[str, Any]:
        with self._change():
            if self.shadow is not None:
                self.shadow.stop()
                self.shadow = None
                self.metrics.set_models(self)
            return self.report()

    # ------------------------------------------------------------------ promotion
    def promote(self, name: str | None, by: str | None = None) -> dict[str, Any]:
        """Make `name` (default: the shadow) the live model; the live one becomes the previous."""
        with self._change():
            shadow = self.shadow
            if name is None:
                if shadow is None:
                    raise UploadError(
                        422, 'name the bundle to promote ({"bundle": "NAME.onnx"}) or shadow one first'
                    )
                model = shadow.model
            else:
                path = self.resolve(name)
                sha = file_sha256(path)
                if sha == self.live.sha256:
                    raise UploadError(409, f"{name} is already the live model ({sha[:12]})")
                model = (
                    shadow.model
                    if shadow is not None and shadow.model.sha256 == sha
                    else self._load(path, sha)
                )
            evidence = shadow.report() if shadow is not None and shadow.model is model else None
            return self._make_live(model, "promote", by, evidence)

    def rollback(self, by: str | None = None) -> dict[str, Any]:
        """Bring the previous live model back (from memory, else from its archived file)."""
        with self._change():
            model = self.previous
            if model is None:
                if self.previous_file is None or not self.previous_file.is_file():
                    raise UploadError(409, "nothing to roll back to: no model was promoted over this one")
                model = self._load(self.previous_file, rollback=True)
            return self._make_live(model, "rollback", by, None)

    def _make_live(self, model: ServedModel, action: str, by: str | None, evidence: dict | None) -> dict:
        old = self.live
        archived = self._archive(old)
        if self.live_path is not None and model.source is not None and model.source != self.live_path:
            try:
                _atomic_copy(model.source, self.live_path)
            except OSError as error:
                raise UploadError(
                    409, f"cannot rewrite the served bundle file ({error.strerror or error}); nothing changed"
                ) from None
        self.live = replace(model, since=time.time())
        self.previous = replace(old, source=archived) if archived is not None else old
        self.previous_file = archived
        if self.shadow is not None and self.shadow.model.sha256 == model.sha256:
            self.shadow.stop()
            self.shadow = None
        record = {
            "time": _iso(time.time()),
            "action": action,
            "by": _clean(by),
            "from": {"name": old.name, "sha256": old.sha256},
            "to": {"name": model.name, "sha256": model.sha256},
            "previous_file": _relative(archived, self.models_dir) if archived is not None else None,
            "shadow": _summary(evidence),
        }
        self._append_history(record)
        if self.on_swap is not None:
            self.on_swap(self.live)
        self.metrics.promotions.labels(action).inc()
        self.metrics.set_models(self)
        logger.info(
            "%s: %s (%s) is live; was %s (%s)", action, model.name, model.version, old.name, old.version
        )
        return {"done": record, **self.report()}

    # ------------------------------------------------------------------ files
    def resolve(self, name: Any) -> Path:
        """The bundle `name` in the models folder: a plain file name, nothing else (422/404 otherwise)."""
        if self.models_dir is None:
            raise UploadError(409, "model changes need a models folder: start serve with --models-dir DIR")
        if not isinstance(name, str) or not _NAME.match(name):
            raise UploadError(
                422,
                "bundle: a file name in the models folder, like candidate.onnx (letters, digits, . _ + -)",
            )
        path = self.models_dir / name
        if not path.is_file():
            there = ", ".join(item["name"] for item in self.candidates()) or "none"
            raise UploadError(404, f"no bundle {name!r} in the models folder (there: {there})")
        return path

    def _load(self, path: Path, sha256: str | None = None, rollback: bool = False) -> ServedModel:
        """Load, check that it takes the live model's input (and, unless rolling back, keeps its classes), and
        run one warm-up inference."""
        if self.load is None:
            raise UploadError(409, "this service cannot load bundles (it was built around a predictor)")
        try:
            model = ServedModel.of(self.load(path), source=path, sha256=sha256)
        except DefectDetError as error:  # its message starts with the path: the answer names the file only
            reason = str(error).replace(f"{path}: ", "").replace(str(path), path.name)
            raise UploadError(422, f"{path.name}: {reason}") from None
        meta, live = model.metadata, self.live.metadata
        if (meta.channels, meta.template) != (live.channels, live.template):
            raise UploadError(
                409,
                f"{path.name} takes {_layout(meta)}, the live model {_layout(live)}: the line's requests would "
                "not fit it",
            )
        dropped = [name for name in live.class_names if name not in meta.class_names]
        if dropped and not rollback:
            raise UploadError(
                409,
                f"{path.name} has no class {', '.join(map(repr, dropped))} of the live model (its classes: "
                f"{', '.join(meta.class_names)}); a new model may add classes, not drop them",
            )
        size = meta.input_size
        image = np.full((size, size) if meta.channels == 1 else (size, size, 3), 114, np.uint8)
        try:
            model.predictor.predict(image, template=image if meta.template else None)
        except Exception as error:
            raise UploadError(422, f"{path.name}: warm-up inference failed ({error})") from None
        return model

    def _archive(self, model: ServedModel) -> Path | None:
        """A copy of `model`'s bytes under previous/ (the live file is about to be rewritten)."""
        if self.models_dir is None:
            return None
        source = self.live_path if model is self.live and self.live_path is not None else model.source
        if source is None or not source.is_file():
            return None
        target = self.models_dir / PREVIOUS_DIR / f"{Path(model.name).stem}-{model.version}.onnx"
        if not (target.is_file() and target.stat().st_size == source.stat().st_size):
            _atomic_copy(source, target)
        return target

    def _append_history(self, record: dict[str, Any]) -> None:
        if self.models_dir is None:
            return
        with open(self.models_dir / HISTORY_FILE, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def _previous_from_history(self) -> Path | None:
        """After a restart: the archived bundle the last promotion to the live model replaced."""
        for record in self.history():
            if record.get("to", {}).get("sha256") == self.live.sha256 and record.get("previous_file"):
                path = (self.models_dir / record["previous_file"]).resolve()  # type: ignore[operator]
                if path.is_file() and path.parent == (self.models_dir / PREVIOUS_DIR).resolve():  # type: ignore[operator]
                    return path
                return None
        return None

    @contextmanager
    def _change(self) -> Iterator[None]:
        if not self._changing.acquire(blocking=False):
            raise UploadError(409, "another model change is in progress; try again when it has finished")
        try:
            yield
        finally:
            self._changing.release()

    def close(self) -> None:
        if self.shadow is not None:
            self.shadow.stop()


def _atomic_copy(source: Path, target: Path) -> None:
    """Copy through a temporary file in the target's folder, fsync, then rename over the target."""
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(handle)
    try:
        shutil.copyfile(source, temporary)
        shutil.copymode(target if target.exists() else source, temporary)  # mkstemp made it 0600
        with open(temporary, "rb") as written:
            os.fsync(written.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _layout(meta: Any) -> str:
    colour = "gray" if meta.channels == 1 else "colour"
    return f"{colour} images {'with' if meta.template else 'without'} a template"


def _brief(result: Any) -> dict[str, Any]:
    return {
        "verdict": result.verdict,
        "detections": [
            {"class_name": d.class_name, "score": round(d.score, 3), "box": [round(v, 1) for v in d.box]}
            for d in result.detections
            if d.score >= result.threshold
        ][:10],
    }


def _summary(evidence: dict[str, Any] | None) -> dict[str, Any] | None:
    if evidence is None:
        return None
    return {key: evidence[key] for key in ("images", "disagreements", "disagreement_rate", "shadow_since")}


def _clean(text: str | None) -> str | None:
    return _PRINTABLE.sub("", text)[:80] or None if text else None


def _relative(path: Path | None, root: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return str(path.resolve().relative_to(root.resolve())) if root is not None else path.name
    except ValueError:
        return path.name


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")
