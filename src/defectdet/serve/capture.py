"""Keeping the images the service answered (`serve --keep`), for review and retraining. No torch import.

Policies (any number): `all`; `flagged` (verdict defective); `uncertain` (a detection scores within
`margin` of the bundle's stored threshold, on either side: the service then asks the model for detections down
to threshold - margin and answers only those at or above the threshold); `drift` (the drift monitor warns or
alerts). `none` keeps nothing.

A kept item is `images/NAME.ext` (the uploaded bytes), `templates/NAME.ext` (when one was sent),
`companions/CAPTURE/NAME.ext` for each companion capture sent (`companions/L2/NAME.png`) and
`predictions/NAME.json` (the sidecar: predictions, bundle, drift state, threshold, time, reasons), each written
to a temporary file and moved into place with `os.replace`, the sidecar last. NAME is the UTC time, the
writing process's id and a random part, so names sort oldest first and never collide.

One folder serves many writers: the workers of `serve --workers N` and replicas on a shared volume. Each item
is written, and the cap enforced, under an exclusive lock on `FOLDER/.keep.lock` (flock; NFS locks too); a
writer indexes the folder again when another one changed it since its last item (`FOLDER/.keep.generation`,
rewritten by every writer) and at least once a minute. So the cap is one cap for the folder, whichever process
writes, and an item another process deleted is simply gone from the index. Temporary files are removed only
once they are an hour old (a crash's; another process may be writing one now).

Writing runs in one background thread fed by a bounded queue: a request never waits for the disk, and capture
never fails a request (a disk error is logged and counted). When the disk cannot keep up and the queue is full,
the answer is still given at once and that item is not kept: counted (`keep_dropped{why="queue"}`) and logged, at
most once a minute with the count. Blocking instead would hand a slow disk's delay to the production line; a
counted gap in the kept images is the smaller harm. Items that queued up meanwhile are written together, up to
`WRITE_BATCH`, under one folder lock and one change mark. Each file is still flushed to disk (fsync) before it is
moved into place: an item's files are flushed at once (a journalling file system commits them together), then
moved in order, the sidecar last. The writer runs at the process's own priority: run nicer, it starved under full
load and the queue turned items away.

Disk cap (`max_bytes`; `serve` keeps at most `DEFAULT_KEEP_MAX_MB` unless told otherwise): the kept images,
templates, companion captures and sidecars never exceed it. When a new item would pass it, the oldest items not
yet reviewed are deleted first, then the oldest decided without a label file (skipped), with a warning in the log
(at most one a minute, with the count); items with a label file are training data and are never deleted, so when
only they are left the new item is not kept (counted as `cap`). Deleting takes the review lock
(`FOLDER/.review.lock`) that every review decision is written under, so an image is never deleted while a
decision on it is being written, and a decision never labels an image already deleted.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from defectdet.data.image_types import image_format

if TYPE_CHECKING:
    from defectdet.runtime.predictor import PredictionResult
    from defectdet.serve.metrics import ServiceMetrics

logger = logging.getLogger(__name__)

KEEP_POLICIES = ("none", "all", "flagged", "uncertain", "drift")
FOLDERS = ("images", "templates", "predictions")
COMPANIONS_DIR = "companions"  # companions/CAPTURE/NAME.ext: one folder per companion capture
EXTENSIONS = {"PNG": ".png", "JPEG": ".jpg", "BMP": ".bmp", "TIFF": ".tif", "WebP": ".webp", "PNM": ".pnm"}
DRIFT_LEVELS = ("warn", "alert")
LOCK_FILE = ".keep.lock"
REVIEW_LOCK = ".review.lock"  # one review decision at a time, and no eviction meanwhile (serve.review)
DECISIONS = "decisions.jsonl"  # the review decisions, one json line each (serve.review)
GENERATION_FILE = ".keep.generation"  # rewritten by every writer: the others index the folder again
GENERATION_BYTES = 48  # the mark's fixed length (process id, '-', 32 hex digits, padded with spaces)
RESCAN_S = 60.0
STALE_TEMPORARY_S = 3600.0
DEFAULT_KEEP_MAX_MB = 2000.0  # serve --keep-max-mb: the keep folder's cap unless one is given (0: none)
EVICTION_WARNING_S = 60.0
FULL_WARNING_S = 60.0  # at most one "keep queue full" warning a minute (with the count)
WRITE_BATCH = 16  # queued items written under one lock: bounds how long other writers wait
FSYNC_THREADS = 4  # an item's files flushed to disk at once (image, template, companions, sidecar)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def parse_keep(values: list[str] | tuple[str, ...] | str) -> tuple[str, ...]:
    """`["flagged,drift", "uncertain"]` -> ("flagged", "drift", "uncertain"); `none` alone -> (); else ValueError."""
    items = [values] if isinstance(values, str) else list(values)
    policies: list[str] = []
    for item in items:
        for part in item.split(","):
            name = part.strip().lower()
            if not name:
                continue
            if name not in KEEP_POLICIES:
                raise ValueError(f"--keep: unknown policy {name!r}; choose from {', '.join(KEEP_POLICIES)}")
            if name not in policies:
                policies.append(name)
    if "none" in policies and len(policies) > 1:
        raise ValueError(
            f"--keep: 'none' cannot be combined with {', '.join(p for p in policies if p != 'none')}"
        )
    return tuple(policy for policy in policies if policy != "none")


def keep_reasons(
    policies: tuple[str, ...] | frozenset[str],
    result: PredictionResult,
    drift_level: str | None,
    stored_threshold: float,
    margin: float,
) -> list[str]:
    """The policies that keep this answer, in `KEEP_POLICIES` order (empty: not kept).

    `result.detections` may include detections below the verdict threshold (down to threshold - margin).
    """
    reasons = []
    if "all" in policies:
        reasons.append("all")
    if "flagged" in policies and result.verdict == "defective":
        reasons.append("flagged")
    if "uncertain" in policies and any(
        abs(detection.score - stored_threshold) <= margin for detection in result.detections
    ):
        reasons.append("uncertain")
    if "drift" in policies and drift_level in DRIFT_LEVELS:
        reasons.append("drift")
    return reasons


@dataclass
class KeptItem:
    """One answer to keep: the uploaded bytes (image, template, companion captures by name) and the sidecar's
    content."""

    image: bytes | bytearray
    template: bytes | bytearray | None
    sidecar: dict[str, Any]
    companions: dict[str, bytes | bytearray] = field(default_factory=dict)


class Capture:
    """The keep folder, its disk cap and the writer thread. `submit` never blocks and never raises."""

    def __init__(
        self,
        folder: str | Path,
        max_bytes: int | None = None,
        metrics: ServiceMetrics | None = None,
        queue_size: int = 64,
    ) -> None:
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.queue: queue.Queue[KeptItem | None] = queue.Queue(queue_size)
        self.items: OrderedDict[str, list[str]] = OrderedDict()  # name -> its files' paths, oldest first
        self.bytes = 0
        self.counts: dict[str, int] = {}  # kept by reason, errors, dropped: for tests and the log
        self._evicted_unreported = 0
        self._eviction_warned = -math.inf
        self._dropped_unreported = 0  # answers the full queue turned away since the last warning
        self._full_warned = -math.inf
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._flushers: ThreadPoolExecutor | None = None  # the writer's fsyncs of one item, at once
        self._sizes: dict[str, int] = {}  # path -> bytes (a kept file never changes after its os.replace)
        self._generation = ""  # the folder's change mark as this process last indexed it
        self._decided: tuple[tuple[int, int] | None, frozenset[str]] = (None, frozenset())
        self._scanned = -math.inf
        for name in FOLDERS:
            (self.folder / name).mkdir(parents=True, exist_ok=True)
        with folder_lock(self.folder / LOCK_FILE):
            self._scan()

    # ---------------------------------------------------------------- the folder
    def _scan(self) -> None:
        """Index the folder as it is now (other processes keep and evict too): names sort by time. Temporary
        files older than `STALE_TEMPORARY_S` are a crash's and removed."""
        found: dict[str, list[str]] = {}
        sizes: dict[str, int] = {}
        now = time.time()
        for sub in [*FOLDERS, *self._companion_folders()]:
            with os.scandir(self.folder / sub) as entries:
                for entry in entries:
                    try:
                        if not entry.is_file(follow_symlinks=False):
                            continue
                        if entry.name.startswith("."):
                            if (
                                entry.name.endswith(".tmp")
                                and now - entry.stat().st_mtime > STALE_TEMPORARY_S
                            ):
                                os.unlink(entry.path)
                            continue
                        sizes[entry.path] = self._sizes.get(entry.path) or entry.stat().st_size
                    except FileNotFoundError:  # deleted by another process meanwhile
                        continue
                    found.setdefault(entry.name.split(".")[0], []).append(entry.path)
        self._sizes = sizes
        self.items = OrderedDict((name, found[name]) for name in sorted(found))
        self.bytes = sum(sizes.values())
        self._generation = self._read_generation()
        self._scanned = time.monotonic()
        self._set_bytes()

    def _companion_folders(self) -> list[str]:
        """`companions/CAPTURE` of every companion capture kept so far."""
        root = self.folder / COMPANIONS_DIR
        if not root.is_dir():
            return []
        with os.scandir(root) as entries:
            return [
                f"{COMPANIONS_DIR}/{entry.name}"
                for entry in entries
                if entry.is_dir(follow_symlinks=False) and not entry.name.startswith(".")
            ]

    def _read_generation(self) -> str:
        try:
            return (self.folder / GENERATION_FILE).read_text()
        except OSError:
            return ""

    def _sync(self) -> None:
        """Index the folder again when another writer changed it since (its change mark differs), and at least
        every `RESCAN_S` (files deleted by hand)."""
        if self._read_generation() != self._generation or time.monotonic() - self._scanned > RESCAN_S:
            self._scan()

    def _changed(self) -> None:
        """A new change mark: the other writers index the folder again before their next item. Rewritten in
        place (every reader and writer of the mark holds the folder lock, so none sees it half written): one
        open and one write per batch, not a temporary file and a rename."""
        # always GENERATION_BYTES long: written over the last mark, no truncation (on ext4 a truncated file
        # rewritten is flushed when closed)
        self._generation = f"{os.getpid()}-{uuid.uuid4().hex}".ljust(GENERATION_BYTES)[:GENERATION_BYTES]
        descriptor = os.open(self.folder / GENERATION_FILE, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, self._generation.encode())  # at offset 0: over the last mark
        finally:
            os.close(descriptor)

    def _set_bytes(self) -> None:
        if self.metrics is not None:
            self.metrics.kept_bytes.set(self.bytes)

    def _count(self, key: str, reason: str | None = None) -> None:
        label = f"{key}:{reason}" if reason else key
        self.counts[label] = self.counts.get(label, 0) + 1
        if self.metrics is None:
            return
        if key == "kept" and reason:
            self.metrics.kept.labels(reason).inc()
        elif key == "error":
            self.metrics.keep_errors.inc()
        elif key == "dropped" and reason:
            self.metrics.keep_dropped.labels(reason).inc()
        elif key == "evicted":
            self.metrics.keep_evicted.inc()

    # ---------------------------------------------------------------- the writer thread
    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="defectdet-keep", daemon=True)
                self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued, then end the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self.queue.put(None)
            thread.join(timeout)
        if self._flushers is not None:
            self._flushers.shutdown(wait=False)
            self._flushers = None

    def _fsync_all(self, descriptors: list[int]) -> None:
        """fsync the files of one item at once, on a few threads: a journalling file system (ext4, xfs) commits
        concurrent fsyncs together, so an item costs about one disk flush, not one per file."""
        if len(descriptors) < 2:
            _fsync_each(descriptors)
            return
        if self._flushers is None:
            self._flushers = ThreadPoolExecutor(FSYNC_THREADS, thread_name_prefix="defectdet-keep-fsync")
        for _ in self._flushers.map(os.fsync, descriptors):  # raises the first failure
            pass

    def submit(self, item: KeptItem) -> bool:
        """Queue `item` for writing; False (counted) when the queue is full."""
        self.start()
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            self._count("dropped", "queue")
            self._warn_full()
            return False
        return True

    def _warn_full(self) -> None:
        """Log the answers a full queue turned away: the first at once, then at most once a minute with the
        count (a disk that cannot keep up turns one away per request; the log says so, it is not flooded)."""
        with self._lock:
            self._dropped_unreported += 1
            now = time.monotonic()
            if now - self._full_warned < FULL_WARNING_S:
                return
            count, self._dropped_unreported, self._full_warned = self._dropped_unreported, 0, now
        logger.warning(
            "keep queue full (%d items waiting for the disk): %d answer(s) not kept since the last warning; "
            'the answers themselves were not delayed (counted in defectdet_keep_dropped_total{why="queue"})',
            self.queue.maxsize,
            count,
        )

    def drain(self) -> None:
        """Block until every queued item is written (tests, shutdown)."""
        self.queue.join()

    def _run(self) -> None:
        while True:
            batch = [self.queue.get()]
            while batch[-1] is not None and len(batch) < WRITE_BATCH:  # what queued up meanwhile, no waiting
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            items = [item for item in batch if item is not None]
            try:
                self.write_all(items)
            finally:
                for _ in batch:
                    self.queue.task_done()
            if batch[-1] is None:
                return

    # ---------------------------------------------------------------- items
    def write(self, item: KeptItem) -> str | None:
        """Write one item now; its name, or None when it was not kept."""
        with folder_lock(self.folder / LOCK_FILE):
            self._sync()
            try:
                return self._write(item)
            finally:
                self._changed()

    def write_all(self, items: list[KeptItem]) -> None:
        """Write `items` under one folder lock and one change mark (the thread calls this). Never raises: an
        item that fails is logged and counted, and the others are still written."""
        if not items:
            return
        done = 0
        try:
            with folder_lock(self.folder / LOCK_FILE):
                self._sync()
                try:
                    for item in items:
                        try:
                            self._write(item)
                        except Exception as error:  # the next item may succeed
                            logger.warning("could not keep an answer: %s", error)
                            self._count("error")
                        done += 1
                finally:
                    self._changed()
        except Exception as error:  # the lock, the folder or its change mark: each item not yet tried is lost
            logger.warning("could not keep %d answer(s): %s", len(items) - done, error)
            for _ in items[done:] or [None]:  # all written, the change mark failed: one error, as one item's
                self._count("error")

    def _write(self, item: KeptItem) -> str | None:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(item.sidecar.get("time", time.time())))
        name = f"{stamp}Z-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        extension = EXTENSIONS.get(image_format(item.image) or "", ".bin")
        files: list[tuple[Path, bytes | bytearray]] = [
            (self.folder / "images" / f"{name}{extension}", item.image)
        ]
        if item.template is not None:
            template_ext = EXTENSIONS.get(image_format(item.template) or "", ".bin")
            files.append((self.folder / "templates" / f"{name}{template_ext}", item.template))
        sidecar = {
            **item.sidecar,
            "image": f"images/{files[0][0].name}",
            "template": f"templates/{files[1][0].name}" if item.template is not None else None,
        }
        if item.companions:
            sidecar["companions"] = {}
        for capture, data in item.companions.items():
            folder = self.folder / COMPANIONS_DIR / capture
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{name}{EXTENSIONS.get(image_format(data) or '', '.bin')}"
            files.append((path, data))
            sidecar["companions"][capture] = path.relative_to(self.folder).as_posix()
        # one line: json's C encoder (an indented dump runs the pure-Python one, 0.3 ms more per item)
        body = json.dumps(sidecar, default=_native).encode()
        files.append((self.folder / "predictions" / f"{name}.json", body))
        size = sum(len(data) for _, data in files)
        if not self._make_room(size):
            logger.warning(
                "keep folder at its cap (%d bytes of reviewed items): an answer was not kept", self.bytes
            )
            self._count("dropped", "cap")
            return None
        write_files(files, self._fsync_all)  # the sidecar last: an item with a sidecar is complete
        self.items[name] = [str(path) for path, _ in files]
        self._sizes.update((str(path), len(data)) for path, data in files)
        self.bytes += size
        self._set_bytes()
        for reason in item.sidecar.get("reasons", []):
            self._count("kept", reason)
        return name

    def _make_room(self, size: int) -> bool:
        """Delete the oldest undecided items, then the oldest decided ones without a label file, until `size`
        more bytes fit under the cap; False if they cannot. Under the review lock: no decision is being
        written while an image is deleted."""
        if self.max_bytes is None:
            return True
        if size > self.max_bytes:
            return False
        if self.bytes + size > self.max_bytes:
            with folder_lock(self.folder / REVIEW_LOCK):
                for name in self._victims(self.bytes + size - self.max_bytes):
                    for path in self.items.pop(name):
                        self.bytes -= self._sizes.pop(path, 0)
                        with contextlib.suppress(FileNotFoundError):  # another process may have deleted it
                            os.unlink(path)
                    self._count("evicted")
                    self._evicted_unreported += 1
        self._set_bytes()
        self._warn_eviction()
        return self.bytes + size <= self.max_bytes

    def _victims(self, excess: int) -> list[str]:
        """The items to delete to free `excess` bytes: the oldest undecided first, then the oldest decided ones;
        never a labelled one. Walks the index only as far as it must: at the cap, each new item usually
        deletes one old one, whatever the folder holds."""
        decided = self._decided_names()
        undecided = (name for name in self.items if name not in decided)
        chosen: list[str] = []
        freed = 0
        for name in itertools.chain(undecided, (name for name in self.items if name in decided)):
            if freed >= excess:
                break
            if (self.folder / "labels" / f"{name}.txt").exists():
                continue  # labelled: training data, never deleted
            chosen.append(name)
            freed += sum(self._sizes.get(path, 0) for path in self.items[name])
        return chosen

    def _decided_names(self) -> frozenset[str]:
        """The names (file stems) of the images a review decision was saved on; read again when
        `decisions.jsonl` changed. A torn line is skipped."""
        path = self.folder / DECISIONS
        try:
            stat = path.stat()
        except OSError:
            return frozenset()
        mark = (stat.st_size, stat.st_mtime_ns)
        if self._decided[0] != mark:
            names = set()
            with open(path, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    try:
                        names.add(Path(json.loads(line)["image"]).stem)
                    except (ValueError, KeyError, TypeError):
                        continue
            self._decided = (mark, frozenset(names))
        return self._decided[1]

    def _warn_eviction(self) -> None:
        """Log the unreviewed items the cap deleted: the first time at once, then at most once a minute."""
        now = time.monotonic()
        if not self._evicted_unreported or now - self._eviction_warned < EVICTION_WARNING_S:
            return
        logger.warning(
            "keep folder %s reached its cap of %.0f MB: deleted %d unreviewed item(s), oldest first; review "
            "them sooner or raise --keep-max-mb",
            self.folder,
            self.max_bytes / 2**20 if self.max_bytes else 0,
            self._evicted_unreported,
        )
        self._evicted_unreported = 0
        self._eviction_warned = now


@contextmanager
def folder_lock(path: Path) -> Iterator[None]:
    """An exclusive lock between processes (flock on `path`, created if missing); none where fcntl is not."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system: one process per folder
        yield
        return
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def atomic_write(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder, flushed to disk (fsync), and
    `os.replace`."""
    write_files([(path, data)])


def write_files(
    files: list[tuple[str | Path, bytes | bytearray]], fsync_all: Callable[[list[int]], None] | None = None
) -> None:
    """Write each (path, data) to a temporary file beside its path, flush them all to disk (`fsync_all`
    gets their descriptors; default: one fsync after the other), then move them into place with `os.replace`
    in order: the last file appears only once every other one is on disk and in place. On an error nothing
    of them is left: the temporaries and the files already moved are removed. Plain file descriptors, no
    buffered file objects."""
    staged: list[tuple[str, str]] = []  # (temporary, path)
    descriptors: list[int] = []
    moved: list[str] = []
    try:
        for path, data in files:
            path = os.fspath(path)
            folder, name = os.path.split(path)
            staged.append((os.path.join(folder, f".{name}.{os.urandom(3).hex()}.tmp"), path))
            descriptors.append(os.open(staged[-1][0], _CREATE, 0o666))
            view = memoryview(data)
            while view:
                view = view[os.write(descriptors[-1], view) :]
        (fsync_all or _fsync_each)(descriptors)
        while descriptors:
            os.close(descriptors.pop())
        for temporary, path in staged:
            os.replace(temporary, path)
            moved.append(path)
    except BaseException:
        for descriptor in descriptors:
            with contextlib.suppress(OSError):
                os.close(descriptor)
        for path in [temporary for temporary, _ in staged[len(moved) :]] + moved:
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise


def _fsync_each(descriptors: list[int]) -> None:
    for descriptor in descriptors:
        os.fsync(descriptor)


def _native(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
