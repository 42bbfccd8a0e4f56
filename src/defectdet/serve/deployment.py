"""Which bundle answers, which one runs beside it, and which ones came before (`serve --models-dir`).

A candidate bundle is copied into the models folder (by hand, scp, or from the fine-tune run's export).
`POST /v1/models/shadow` copies its bytes into the models store and runs that copy beside the live model on
every answered image: its answers are never returned, only compared with the live ones (`disagreement`),
and the rate shows in /metrics and /v1/models. `POST /v1/models/promote` makes exactly those bytes the
live model (replacing the file in the models folder afterwards changes nothing); it needs a `compare`
verdict of "promote" for the pair, or `force`. `POST /v1/models/rollback` brings back the model before,
and the one before that on a second roll-back, down the store's history.

Every promotion and roll-back is a generation of the models store (`serve.store`) that all processes
serving the line share: each process polls the store and loads the generation's bundle (its sha256
checked) beside the live model, then swaps. A swap is one reference assignment: a request takes the live
model once, when its inference starts, and finishes on it, so no request is dropped or answered by half of
each model. A process that starts serves the store's current generation. No torch import.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from defectdet.errors import DefectDetError
from defectdet.runtime.bundle import BundleMetadata, file_sha256
from defectdet.runtime.model_quality import validation_quality
from defectdet.runtime.monitor import DriftMonitor
from defectdet.runtime.predictor import PredictionResult
from defectdet.serve.servable import ServablePredictor
from defectdet.serve.store import (
    DEFAULT_KEEP,
    STORE_DIR,
    Entry,
    ModelStore,
    StaleGeneration,
    StoreError,
    compare_verdict,
)
from defectdet.serve.upload import UploadError, visible_name

logger = logging.getLogger(__name__)

MATCH_IOU = 0.5
POLL_S = 0.5  # how often a process reads the store's current generation
RETRY_FIRST_S = 1.0  # a generation that failed to load here is tried again after this, doubling
RETRY_MAX_S = 60.0  # ... up to this
BEHIND_GRACE_S = 60.0  # serving another generation than the store's longer than this: not ready
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}\.onnx$")


def predict_planes(
    predictor: ServablePredictor,
    image: np.ndarray,
    template: np.ndarray | None,
    companions: Mapping[str, np.ndarray] | None = None,
    **options: Any,
) -> PredictionResult:
    """`predictor.predict` on one image's planes; `companions` passed only when there are some, so a stand-in
    predictor for a model without them needs no such keyword."""
    if companions:
        options["companions"] = companions
    return predictor.predict(image, template=template, **options)


def warm_up(predictor: ServablePredictor) -> PredictionResult:
    """One inference on a blank image (and blank template and companions, when the model takes them)."""
    meta = predictor.metadata
    size = meta.input_size
    image = np.full((size, size) if meta.channels == 1 else (size, size, 3), 114, np.uint8)
    image[size // 4 : size // 2, size // 4 : size // 2] = 200
    companions = {name: image for name in getattr(meta, "companions", ())}
    return predict_planes(predictor, image, image if meta.template else None, companions)


def bundle_sha256(predictor: ServablePredictor) -> str:
    """sha256 (hex) of the bundle file when there is one, else of its metadata; its first 12 hex digits are
    the model version."""
    path = getattr(predictor, "path", None)
    if path is not None and Path(path).is_file():
        return file_sha256(Path(path))
    return hashlib.sha256(predictor.metadata.to_json().encode()).hexdigest()


@dataclass(frozen=True)
class ServedModel:
    """A loaded bundle and its drift charts. `source`: a file that holds its bytes (None: in memory only)."""

    predictor: ServablePredictor
    sha256: str
    name: str
    source: Path | None
    since: float
    monitor: DriftMonitor | None

    @classmethod
    def of(
        cls,
        predictor: ServablePredictor,
        source: Path | None = None,
        sha256: str | None = None,
        name: str | None = None,
    ) -> ServedModel:
        """`sha256`: the bundle's hash when the caller already read it (else hashed here); `name`: the name
        it was promoted as (default: its file's)."""
        path = getattr(predictor, "path", None)
        source = source or (Path(path) if path is not None else None)
        reference = predictor.metadata.drift_reference
        return cls(
            predictor=predictor,
            sha256=sha256 or bundle_sha256(predictor),
            name=name or (source.name if source is not None else "in-memory"),
            source=source,
            since=time.time(),
            monitor=DriftMonitor(reference) if reference else None,
        )

    @property
    def metadata(self) -> BundleMetadata:
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
            "threshold": meta.thresholds.threshold,
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


@dataclass(frozen=True)
class _Retry:
    """A store generation that failed to load in this process: tries so far, when to try again, why."""

    generation: int
    attempts: int
    at: float  # time.monotonic()
    reason: str


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

    def submit(
        self,
        image: np.ndarray,
        template: np.ndarray | None,
        live_result: Any,
        companions: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        with self._lock:
            if self._pending >= self.max_pending:
                self.skipped += 1
                self.metrics.shadow_skipped.inc()
                return
            self._pending += 1
        try:
            self._executor.submit(self._compare, image, template, live_result, companions)
        except RuntimeError:  # stopped meanwhile
            with self._lock:
                self._pending -= 1

    def _compare(
        self,
        image: np.ndarray,
        template: np.ndarray | None,
        live_result: Any,
        companions: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        try:
            answer = predict_planes(self.model.predictor, image, template, companions)
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
    """The live model, an optional shadow and the models store's history; changes one at a time (409 while
    one runs in this process; the store's generation check between processes).

    `load(path)` builds a predictor for a bundle file (the server passes its threads and pixel limit);
    `on_swap(model)` runs after the live model changed (the server resets the drift metrics to its charts).
    `keep`: models the store keeps for roll-back behind the live one.
    """

    def __init__(
        self,
        live: ServedModel,
        metrics: Any,
        *,
        models_dir: str | Path | None = None,
        live_path: Path | None = None,
        load: Callable[[Path], ServablePredictor] | None = None,
        on_swap: Callable[[ServedModel], None] | None = None,
        keep: int = DEFAULT_KEEP,
    ) -> None:
        self.live = live
        self.metrics = metrics
        self.models_dir = Path(models_dir) if models_dir is not None else None
        self.live_path = live_path
        self.load = load
        self.on_swap = on_swap
        self.shadow: ShadowRun | None = None
        self.previous: ServedModel | None = None  # loaded, for a fast roll-back (this process only)
        self.store = ModelStore(self.models_dir / STORE_DIR, keep) if self.models_dir is not None else None
        self.generation: int | None = None  # the store generation this process serves
        self.store_seen: int | None = None  # the newest generation this process read from the store
        self._changing = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._retry: _Retry | None = None  # a store generation that failed to load here, when to try again
        self._owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # its shadow note's name
        self._behind_since: float | None = None  # monotonic time this process first saw another generation
        if self.store is not None:
            self._join_store()
        self.metrics.set_models(self)

    def _join_store(self) -> None:
        """Serve the store's current generation; an empty store starts with the bundle `serve` was given."""
        assert self.store is not None
        try:
            current = self.store.repair()  # a torn `current` rewritten from history/, or refused naming it
        except OSError:  # a read-only store: read what is there
            current = self.store.current()
        current = current or self._start_store()
        if current is None:
            return
        entry = Entry.of(current["live"])
        if entry.sha256 != self.live.sha256:
            logger.warning(
                "the models store's generation %d is %s (%s): serving it instead of %s (%s)",
                current["generation"],
                entry.name,
                entry.version,
                self.live.name,
                self.live.version,
            )
            try:
                self.live = self._load(
                    self.store.verified(entry), entry.sha256, rollback=True, name=entry.name
                )
            except (UploadError, StoreError) as error:
                raise StoreError(
                    f"{self.store.root}: generation {current['generation']} ({entry.name}) cannot be served: {error}"
                ) from None
            self.metrics.set_drift_charts(self.live.monitor)
        self.generation = self.store_seen = current["generation"]

    def _start_store(self) -> dict[str, Any] | None:
        """Generation 1: the bundle `serve` was given (None when it has no file, or the store is read-only)."""
        assert self.store is not None
        if self.live_path is None or self.live.source is None:
            return None
        try:
            entry = self.store.stage(self.live_path, self.live.name)
            if entry.sha256 != self.live.sha256:
                raise StoreError(f"{self.live_path}: the file changed while it loaded; start again")
            return self.store.commit(0, "start", entry, by="serve")
        except StaleGeneration as raced:  # another process started the store first
            return raced.current
        except OSError as error:
            logger.warning(
                "cannot write the models store %s (%s): serving %s; promotions will be refused",
                self.store.root,
                error.strerror or error,
                self.live.name,
            )
            return None

    # ------------------------------------------------------------------ reading
    def report(self) -> dict[str, Any]:
        shadow = self.shadow
        current = self._current_quietly()
        stack = current["stack"] if current is not None else []
        previous = None
        if stack:
            previous = {**_entry_report(stack[0]), **(self._previous_description(stack[0]) or {})}
        return {
            "live": {**self.live.describe(), "generation": self.generation},
            "shadow": self._shadow_report(shadow) if shadow is not None else None,
            "previous": previous,
            "rollback_history": [_entry_report(item) for item in stack],
            "store": _store_report(current),
            "models_dir": self.models_dir is not None,
            "candidates": self.candidates(),
            "history": self.history(limit=20),
        }

    def _shadow_report(self, shadow: ShadowRun) -> dict[str, Any]:
        """The shadow's figures and the compare verdict on (live, shadow) the promotion gate would use."""
        verdict = None
        if self.models_dir is not None:
            verdict = compare_verdict(self.models_dir, self.live.sha256, shadow.model.sha256)
        return {**shadow.report(), "compare": verdict}

    def _previous_description(self, item: dict[str, Any]) -> dict[str, Any] | None:
        previous = self.previous
        if previous is not None and previous.sha256 == item.get("sha256"):
            return {**previous.describe(), "name": item["name"]}
        return None

    def _current_quietly(self) -> dict[str, Any] | None:
        if self.store is None:
            return None
        try:
            return self.store.current()
        except StoreError as error:
            logger.warning("%s", error)
            return None

    def candidates(self) -> list[dict[str, Any]]:
        """The bundle files in the models folder (names only: the folder's path is not shown)."""
        if self.models_dir is None:
            return []
        found = []
        for path in sorted(self.models_dir.glob("*.onnx")):
            if path.is_file() and not path.is_symlink() and _NAME.match(path.name):
                stat = path.stat()
                found.append({"name": path.name, "bytes": stat.st_size, "modified": _iso(stat.st_mtime)})
        return found

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The store's generations (promotions, roll-backs, the start), newest first."""
        return self.store.history(limit) if self.store is not None else []

    # ------------------------------------------------------------------ shadow
    def observe(
        self,
        image: np.ndarray,
        template: np.ndarray | None,
        live_result: Any,
        companions: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """Hand one answered image to the shadow, if one runs (never raises, never waits)."""
        shadow = self.shadow
        if shadow is not None:
            shadow.submit(image, template, live_result, companions)

    def start_shadow(
        self, name: str, unless_live: bool = False, by: str | None = None, client: str | None = None
    ) -> dict[str, Any]:
        """Copy the candidate's bytes into the store and run that copy beside the live model. `unless_live`
        (`serve --shadow` at start): a candidate that is already live (promoted meanwhile) is no error."""
        with self._change():
            try:
                model = self._candidate(name)
            except UploadError as error:
                if not (unless_live and "already the live model" in error.reason):
                    raise
                logger.warning("no shadow: %s", error.reason)
                return self.report()
            old, self.shadow = self.shadow, ShadowRun(model, self.metrics)
            if old is not None:
                old.stop()
            if model.source is not None:
                self._note_shadow(Entry(model.name, model.sha256, model.source.name), by, client)
            self.metrics.set_models(self)
            logger.info("shadow: %s (%s) runs beside %s", model.name, model.version, self.live.name)
            return self.report()

    def stop_shadow(self, by: str | None = None, client: str | None = None) -> dict[str, Any]:
        with self._change():
            if self.shadow is not None:
                self.shadow.stop()
                self.shadow = None
                self._note_shadow(None, by, client)
                self.metrics.set_models(self)
            return self.report()

    def _candidate(self, name: str) -> ServedModel:
        """The bundle `name` of the models folder, copied into the store and loaded from that copy."""
        path = self.resolve(name)
        assert self.store is not None
        try:
            entry = self.store.stage(path, name)
        except OSError as error:
            raise UploadError(
                409, f"cannot copy {name} into the models store ({error.strerror or error})"
            ) from None
        if entry.sha256 == self.live.sha256:
            raise UploadError(409, f"{name} is already the live model ({entry.version})")
        shadow = self.shadow
        if shadow is not None and shadow.model.sha256 == entry.sha256:
            return shadow.model
        return self._load(self.store.path(entry), entry.sha256, name=name)

    # ------------------------------------------------------------------ promotion
    def promote(
        self,
        name: str | None,
        by: str | None = None,
        force: bool = False,
        generation: int | None = None,
        client: str | None = None,
    ) -> dict[str, Any]:
        """Make `name` (default: this process's shadow, exactly the bytes it ran) the live model of every
        process on the store. Needs a `compare` verdict of "promote" for (live, candidate) in the models
        folder, or `force`. `generation`: the store generation the decision was made on (default: the one
        served here); `by`, `client`: who asks and from which address (recorded)."""
        with self._change():
            shadow = self.shadow
            if name is None:
                if shadow is None:
                    raise UploadError(409, self._no_shadow_here())
                model = shadow.model
            else:
                model = self._candidate(name)
            evidence = shadow.report() if shadow is not None and shadow.model is model else None
            verdict = self._gate(model, force)
            record = self._commit(
                generation,
                "promote",
                model,
                by,
                client=client,
                shadow=_summary(evidence),
                compare=verdict,
                forced=bool(force) and (verdict or {}).get("decision") != "promote",
            )
            return self._make_live(model, record)

    def _no_shadow_here(self) -> str:
        """Why `promote {}` is refused here: this process runs no shadow; where one runs, if anywhere."""
        here = f"{socket.gethostname()}, pid {os.getpid()}"
        notes = self.store.shadows() if self.store is not None else []
        if not notes:
            return (
                f"no shadow runs in this process ({here}) nor in another one on the models store: name the "
                'bundle to promote ({"bundle": "NAME.onnx"}) or shadow one first'
            )
        where = "; ".join(
            f"{note.get('name')} ({str(note.get('sha256'))[:12]}) in {note.get('host')}, pid {note.get('pid')} "
            f"since {note.get('time')}"
            for note in notes[:3]
        )
        return (
            f"no shadow runs in this process ({here}): a shadow is per process, and this request reached "
            f"another replica than the one running it. Shadows on the models store: {where}. Promote through "
            'that process, or name the bundle here ({"bundle": "NAME.onnx"}; the evidence of its shadow '
            "run then stays with that process)"
        )

    def _gate(self, model: ServedModel, force: bool) -> dict[str, Any] | None:
        """The compare verdict on (live, `model`); 409 unless it says promote or `force` is given."""
        assert self.models_dir is not None
        verdict = compare_verdict(self.models_dir, self.live.sha256, model.sha256)
        if force or (verdict is not None and verdict["decision"] == "promote"):
            return verdict
        if verdict is None:
            reason = (
                f"no compare verdict on {self.live.name} ({self.live.version}) -> {model.name} "
                f"({model.version}) in the models folder: run 'defectdet compare LIVE.onnx {model.name} "
                "DATA --out MODELS_DIR/compare' on the line's held-out images"
            )
        else:
            reason = f"compare said keep ({verdict['file']}: {'; '.join(verdict['reasons'][:2])})"
        raise UploadError(409, f"{reason}; to promote anyway, send force: true")

    def rollback(
        self, by: str | None = None, generation: int | None = None, client: str | None = None
    ) -> dict[str, Any]:
        """Bring back the model before the live one in the store's history (a second roll-back goes back
        one more)."""
        with self._change():
            if self.store is None:
                raise UploadError(
                    409, "model changes need a models folder: start serve with --models-dir DIR"
                )
            current = self._current_or_409()
            if current is None or not current["stack"]:
                raise UploadError(409, "nothing to roll back to: no model was promoted over this one")
            target = Entry.of(current["stack"][0])
            model = self._load_entry(target)
            record = self._commit(generation, "rollback", model, by, client=client)
            return self._make_live(model, record)

    def _load_entry(self, entry: Entry) -> ServedModel:
        """A model the store refers to: the one loaded here before when it is that one, else its checked file."""
        assert self.store is not None
        previous = self.previous
        if previous is not None and previous.sha256 == entry.sha256:
            return replace(previous, name=entry.name, source=self.store.path(entry))
        try:
            path = self.store.verified(entry)
        except StoreError as error:
            raise UploadError(409, str(error)) from None
        return self._load(path, entry.sha256, rollback=True, name=entry.name)

    def _current_or_409(self) -> dict[str, Any] | None:
        assert self.store is not None
        try:
            return self.store.current()
        except StoreError as error:
            raise UploadError(409, str(error).replace(str(self.models_dir), "models")) from None

    def _commit(
        self, generation: int | None, action: str, model: ServedModel, by: str | None, **details: Any
    ) -> dict[str, Any]:
        """Write the store's next generation (409 when it moved on since `generation`)."""
        assert self.store is not None
        if model.source is None or model.source.parent != self.store.bundles:
            raise UploadError(409, f"{model.name} is not in the models store; shadow or name it again")
        entry = Entry(model.name, model.sha256, model.source.name)
        base = generation if generation is not None else (self.generation or 0)
        try:
            return self.store.commit(base, action, entry, clean_name(by), **details)
        except StaleGeneration as error:
            raise UploadError(409, str(error)) from None
        except StoreError as error:
            raise UploadError(409, str(error).replace(str(self.models_dir), "models")) from None
        except OSError as error:
            raise UploadError(
                409, f"cannot write the models store ({error.strerror or error}); nothing changed"
            ) from None

    def _make_live(self, model: ServedModel, record: dict[str, Any]) -> dict[str, Any]:
        """Serve the committed `record` here and answer it. The generation is written: nothing here may turn
        that into an error answer (a swap that fails is logged, and the store poll tries again)."""
        done = {"done": {**record, "to": record["live"]}}
        try:
            return {**done, **self._swapped_here(model, record)}
        except Exception as error:
            logger.exception("generation %d is committed but not served here yet", record["generation"])
            return {**done, "warning": f"committed; this process did not switch yet ({error})"}

    def _swapped_here(self, model: ServedModel, record: dict[str, Any]) -> dict[str, Any]:
        old = self._swap(model, record)
        self.metrics.promotions.labels(record["action"]).inc()
        logger.info(
            "%s: %s (%s) is live, generation %d; was %s (%s)",
            record["action"],
            model.name,
            model.version,
            record["generation"],
            old.name,
            old.version,
        )
        return self.report()

    def _swap(self, model: ServedModel, record: dict[str, Any]) -> ServedModel:
        """`model` answers from the next request on; the store's `record` is what this process serves."""
        old = self.live
        if model.sha256 != old.sha256:
            self.live = replace(model, since=time.time())
            self.previous = old
        self.generation = self.store_seen = record["generation"]
        self._caught_up()
        if self.shadow is not None and self.shadow.model.sha256 == model.sha256:
            self.shadow.stop()
            self.shadow = None
            self._unmark_shadow()  # the promotion's line in promotions.jsonl carries its evidence
        if self.on_swap is not None and model.sha256 != old.sha256:
            self.on_swap(self.live)
        self.metrics.set_models(self)
        return old

    # ------------------------------------------------------------------ following the store
    def watch(self, interval_s: float = POLL_S) -> None:
        """Poll the store every `interval_s` in a thread and follow its generations (idempotent)."""
        if self.store is None or self._watcher is not None:
            return
        self._watcher = threading.Thread(
            target=self._watch, args=(interval_s,), name="defectdet-store", daemon=True
        )
        self._watcher.start()

    def _watch(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.follow()
            except Exception:  # the loop must outlive any one failure; it is logged
                logger.exception("following the models store failed")

    def follow(self) -> bool:
        """Load and serve the store's current generation when it is not the one served here. True when this
        process changed its model. A generation whose bundle fails to load (a file briefly truncated, a copy
        still arriving on a shared volume) is tried again after RETRY_FIRST_S, doubling up to RETRY_MAX_S;
        meanwhile `not_ready()` says why."""
        current = self._current_quietly()
        if current is None:
            return False
        self.store_seen = current["generation"]
        self.metrics.store_generation.set(current["generation"])
        if current["generation"] == self.generation:
            self._caught_up()
            return False
        if self._behind_since is None:
            self._behind_since = time.monotonic()
        retry = self._retry
        if retry is not None and retry.generation == current["generation"] and time.monotonic() < retry.at:
            return False
        if not self._changing.acquire(blocking=False):
            return False  # a change of this process runs: the next poll looks again
        try:
            entry = Entry.of(current["live"])
            try:
                model = self._load_entry(entry) if entry.sha256 != self.live.sha256 else self.live
            except UploadError as error:
                self._failed_load(current["generation"], error.reason)
                return False
            old = self._swap(model, current)
            logger.info(
                "store generation %d (%s %s, %s): %s (%s) is live here; was %s (%s)",
                current["generation"],
                current["action"],
                current.get("by") or "",
                current["time"],
                model.name,
                model.version,
                old.name,
                old.version,
            )
            return True
        finally:
            self._changing.release()

    def _failed_load(self, generation: int, reason: str) -> None:
        """Note a failed load of `generation` and when to try again (backing off)."""
        retry = self._retry
        attempts = retry.attempts + 1 if retry is not None and retry.generation == generation else 1
        delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (attempts - 1))
        self._retry = _Retry(generation, attempts, time.monotonic() + delay, reason)
        self.metrics.model_behind_store.set(1)
        logger.error(
            "store generation %d not loaded here (try %d): %s; serving generation %s, trying again in %.0f s",
            generation,
            attempts,
            reason,
            self.generation,
            delay,
        )

    def _caught_up(self) -> None:
        self._retry = None
        self._behind_since = None
        self.metrics.model_behind_store.set(0)

    def not_ready(self) -> str | None:
        """Why this process should take no traffic although it answers: it serves a generation other than
        the store's current one and failed to load that one, or has been behind for over BEHIND_GRACE_S.
        None when it serves the store's generation (or has no store)."""
        seen, served = self.store_seen, self.generation
        if self.store is None or seen is None or seen == served:
            return None
        retry, since = self._retry, self._behind_since
        if retry is not None and retry.generation == seen:
            wait = max(0.0, retry.at - time.monotonic())
            return (
                f"serving store generation {served}, the store's current one is {seen}: it failed to load "
                f"here ({retry.attempts} tries; {retry.reason}); trying again in {wait:.0f} s"
            )
        if since is not None and time.monotonic() - since > BEHIND_GRACE_S:
            self.metrics.model_behind_store.set(1)
            return (
                f"serving store generation {served}, the store's current one is {seen} since "
                f"{time.monotonic() - since:.0f} s"
            )
        return None

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
        if path.is_symlink():  # a link would copy whatever it points at (any file the service can read)
            raise UploadError(
                422, f"{name} is a symbolic link: copy the bundle itself into the models folder"
            )
        if not path.is_file():
            there = ", ".join(item["name"] for item in self.candidates()) or "none"
            raise UploadError(404, f"no bundle {name!r} in the models folder (there: {there})")
        return path

    def _load(
        self, path: Path, sha256: str | None = None, rollback: bool = False, name: str | None = None
    ) -> ServedModel:
        """Load, check its bytes (`sha256`), that it takes the live model's input (and, unless rolling back,
        keeps its classes), and run one warm-up inference."""
        shown = name or path.name
        if self.load is None:
            raise UploadError(409, "this service cannot load bundles (it was built around a predictor)")
        found = file_sha256(path)
        if sha256 is not None and found != sha256:
            raise UploadError(409, f"{shown}: its bytes hash to {found[:12]}, expected {sha256[:12]}")
        try:
            model = ServedModel.of(self.load(path), source=path, sha256=found, name=name)
        except DefectDetError as error:  # its message starts with the path: the answer names the file only
            reason = str(error).replace(f"{path}: ", "").replace(str(path), shown)
            raise UploadError(422, f"{shown}: {reason}") from None
        meta, live = model.metadata, self.live.metadata
        if _planes(meta) != _planes(live):
            raise UploadError(
                409,
                f"{shown} takes {_layout(meta)}, the live model {_layout(live)}: the line's requests would "
                "not fit it",
            )
        dropped = [name for name in live.class_names if name not in meta.class_names]
        if dropped and not rollback:
            raise UploadError(
                409,
                f"{shown} has no class {', '.join(map(repr, dropped))} of the live model (its classes: "
                f"{', '.join(meta.class_names)}); a new model may add classes, not drop them",
            )
        try:
            warm_up(model.predictor)
        except Exception as error:
            raise UploadError(422, f"{shown}: warm-up inference failed ({error})") from None
        return model

    @contextmanager
    def _change(self) -> Iterator[None]:
        if not self._changing.acquire(blocking=False):
            raise UploadError(409, "another model change is in progress; try again when it has finished")
        try:
            yield
        finally:
            self._changing.release()

    def close(self) -> None:
        self._stop.set()
        if self.shadow is not None:
            self.shadow.stop()
            self._unmark_shadow()

    def _unmark_shadow(self) -> None:
        if self.store is not None:
            try:
                self.store.mark_shadow(self._owner, None)
            except OSError as error:
                logger.warning("the shadow's note in the models store is not removed (%s)", error)

    def _note_shadow(self, entry: Entry | None, by: str | None = None, client: str | None = None) -> None:
        """This process's shadow in the store's notes and in promotions.jsonl (a failure is logged)."""
        if self.store is None:
            return
        try:
            self.store.mark_shadow(self._owner, entry, clean_name(by))
            details = {"shadow": entry.to_dict()} if entry is not None else {}
            action = "shadow" if entry is not None else "shadow-stop"
            self.store.log_event(action, clean_name(by), client=client, live=self.live.sha256, **details)
        except OSError as error:
            logger.warning("the shadow is not noted in the models store (%s)", error)


def _entry_report(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": item["name"],
        "model_version": str(item["sha256"])[:12],
        "sha256": item["sha256"],
        "file": f"{STORE_DIR}/bundles/{item['file']}",
    }


def _store_report(current: dict[str, Any] | None) -> dict[str, Any] | None:
    """The store's current generation as /v1/models shows it."""
    if current is None:
        return None
    return {
        "generation": current["generation"],
        "live": _entry_report(current["live"]),
        "action": current["action"],
        "by": current.get("by"),
        "time": current["time"],
    }


def _planes(meta: Any) -> tuple[int, bool, tuple[str, ...]]:
    return meta.channels, meta.template, tuple(getattr(meta, "companions", ()))


def _layout(meta: Any) -> str:
    colour = "gray" if meta.channels == 1 else "colour"
    layout = f"{colour} images {'with' if meta.template else 'without'} a template"
    companions = tuple(getattr(meta, "companions", ()))
    return layout + (f" and the companion captures {', '.join(companions)}" if companions else "")


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


def clean_name(text: str | None) -> str | None:
    """A name as it is recorded (`visible_name`: no control or bidi characters, at most 80); None for none."""
    return visible_name(text) or None if text else None


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")
