"""The models store that every process serving one line shares (`serve --models-dir DIR`, DIR/store/).

The store says which bundle the line serves. Each promotion or roll-back is a new generation:

    DIR/store/bundles/NAME-SHA12.onnx   the exact bytes of every model the store refers to (written once)
    DIR/store/history/00000007.json     generation 7: the live model (name, sha256, file), the models
                                        before it (newest first, the roll-back history), who, when, why
    DIR/store/current                   a copy of the newest generation, replaced atomically (os.replace)
    DIR/store/.lock                     the lock a change holds while it reads and writes the generation
    DIR/promotions.jsonl                one line per change, for people

A change names the generation it was based on; when another change came first (on this host or another
one: the lock is an fcntl record lock, which NFS carries) it is refused with the generation that is live.
Processes poll `current` and load the bundle it names after checking its sha256. No torch import.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from defectdet.errors import DefectDetError
from defectdet.runtime.bundle import file_sha256
from defectdet.runtime.compare_rule import KEEP, verdict_from_document

logger = logging.getLogger(__name__)

STORE_DIR = "store"
LOG_FILE = "promotions.jsonl"
DEFAULT_KEEP = 5  # models kept for roll-back behind the live one
STAGED_MAX_AGE_S = 7 * 24 * 3600  # copies of candidates that never went live are removed after this
RECENT_S = 600.0  # a copy staged (or staged again) this recently stays: a shadow may be promoted from it
COMPARE_FILE = "compare.json"
SHADOWS_DIR = "shadows"  # store/shadows/HOST-PID.json: the shadow each process runs
_IN_PROCESS = threading.Lock()  # fcntl locks belong to the process: threads of one process queue here first


class StoreError(DefectDetError):
    """The store cannot be read or written, or a bundle's bytes are not the ones its generation names."""


class StaleGeneration(Exception):
    """A change based on a generation that is no longer the store's current one."""

    def __init__(self, base: int, current: dict[str, Any]) -> None:
        live = current["live"]
        super().__init__(
            f"generation {current['generation']} is live ({live['name']}, {live['sha256'][:12]}, "
            f"{current['action']} by {current.get('by') or 'someone'}); this change was based on generation "
            f"{base}: reload the models and decide again"
        )
        self.base = base
        self.current = current


@dataclass(frozen=True)
class Entry:
    """One model the store refers to: the name it was promoted as, its sha256 and its file in bundles/."""

    name: str
    sha256: str
    file: str

    @property
    def version(self) -> str:
        return self.sha256[:12]

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "sha256": self.sha256, "file": self.file}

    @classmethod
    def of(cls, record: dict[str, Any]) -> Entry:
        return cls(str(record["name"]), str(record["sha256"]), str(record["file"]))


_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_PLAIN = re.compile(r"[^A-Za-z0-9._-]")


def check_record(record: Any, where: str | Path) -> dict[str, Any]:
    """`record` when it is a generation record the store can act on; else a StoreError naming `where` and
    the field that is wrong (a file edited by hand, or torn)."""

    def wrong(field: str, expected: str) -> StoreError:
        return StoreError(f"{where}: not a generation record: field {field!r} {expected}")

    if not isinstance(record, dict):
        raise StoreError(
            f"{where}: not a generation record (a JSON object is expected, found {type(record).__name__})"
        )
    generation = record.get("generation")
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 1:
        raise wrong("generation", "must be a whole number >= 1")
    if not isinstance(record.get("action"), str):
        raise wrong("action", "must be a text (start, promote or rollback)")
    _check_entry(record.get("live"), "live", wrong)
    stack = record.get("stack")
    if not isinstance(stack, list):
        raise wrong("stack", "must be a list of models (the roll-back history; [] for none)")
    for position, item in enumerate(stack):
        _check_entry(item, f"stack[{position}]", wrong)
    return record


def _check_entry(item: Any, field: str, wrong: Any) -> None:
    """A model of a generation record: name, sha256 (64 hex digits) and a plain file name in bundles/."""
    if not isinstance(item, dict):
        raise wrong(field, "must be a model: {name, sha256, file}")
    if not isinstance(item.get("name"), str):
        raise wrong(f"{field}.name", "must be a text")
    if not isinstance(item.get("sha256"), str) or not _SHA256.match(item["sha256"]):
        raise wrong(f"{field}.sha256", "must be 64 hex digits")
    file = item.get("file")
    if not isinstance(file, str) or file in ("", ".", "..") or any(c in file for c in "/\\\0"):
        raise wrong(f"{field}.file", "must be a file name in bundles/")


class ModelStore:
    """Generations of one line's live model in `root` (DIR/store); `keep` models stay for roll-back."""

    def __init__(self, root: str | Path, keep: int = DEFAULT_KEEP) -> None:
        if keep < 1:
            raise ValueError(f"the models kept for roll-back must be >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep
        self.bundles = self.root / "bundles"
        self.generations = self.root / "history"
        self._reported: str | None = None  # the last problem of `current` logged (logged once)
        try:
            for folder in (self.bundles, self.generations):
                folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StoreError(
                f"{self.root}: cannot create the models store ({error.strerror or error}); the models folder "
                "must be writable by the service"
            ) from None

    # ------------------------------------------------------------------ reading
    def current(self) -> dict[str, Any] | None:
        """The newest generation, or None before the first one. A `current` file that is missing, torn or
        edited into something that is not a generation record is recovered from the newest valid generation
        in history/ (the files a change writes first); without one it is a StoreError naming the file and
        the field."""
        path = self.root / "current"
        problem = None
        try:
            return check_record(json.loads(path.read_text(encoding="utf-8")), path)
        except FileNotFoundError:
            pass
        except OSError as error:
            raise StoreError(f"{path}: cannot read it ({error.strerror or error})") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            problem = f"{path}: not a generation record (not JSON: {error})"
        except StoreError as error:
            problem = str(error)
        recovered = self.newest_generation()
        if recovered is None and problem is not None:
            raise StoreError(
                f"{problem}; no generation in {self.generations} to recover it from: restore the file, or "
                "move the store folder away to start a new store from the bundle serve is given"
            )
        if recovered is not None and problem != self._reported:
            self._reported = problem
            logger.warning(
                "%s: generation %d recovered from history/",
                problem or f"{path}: missing",
                recovered["generation"],
            )
        return recovered

    def newest_generation(self) -> dict[str, Any] | None:
        """The newest valid generation record in history/ (invalid files are skipped with a warning)."""
        for path in sorted(self.generations.glob("*.json"), reverse=True):
            record = self._read_generation(path)
            if record is not None:
                return record
        return None

    def repair(self) -> dict[str, Any] | None:
        """`current` rewritten from history/ when it is missing, torn or invalid there (at start); the
        current generation."""
        with self._locked():
            record = self.current()
            path = self.root / "current"
            try:
                valid = record is not None and json.loads(path.read_text(encoding="utf-8")) == record
            except (OSError, ValueError):
                valid = False
            if record is not None and not valid:
                _atomic_write(path, json.dumps(record, indent=1).encode())
                logger.warning("%s rewritten from generation %d", path, record["generation"])
            return record

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Generations, newest first (files that are not valid generation records are skipped with a
        warning)."""
        records = []
        for path in sorted(self.generations.glob("*.json"), reverse=True):
            record = self._read_generation(path)
            if record is not None:
                records.append(record)
            if limit is not None and len(records) >= limit:
                break
        return records

    def _read_generation(self, path: Path) -> dict[str, Any] | None:
        try:
            return check_record(json.loads(path.read_text(encoding="utf-8")), path)
        except (OSError, ValueError, StoreError) as error:
            logger.warning("%s: skipped (%s)", path, error)
            return None

    def path(self, entry: Entry) -> Path:
        return self.bundles / entry.file

    def verified(self, entry: Entry) -> Path:
        """The file of `entry` after checking that its bytes hash to the entry's sha256."""
        path = self.path(entry)
        if not path.is_file():
            raise StoreError(f"{entry.file}: not in the store (removed by hand?)")
        found = file_sha256(path)
        if found != entry.sha256:
            raise StoreError(
                f"{entry.file}: its bytes hash to {found[:12]}, the store names {entry.version}: not loaded"
            )
        return path

    # ------------------------------------------------------------------ writing
    def stage(self, source: Path, name: str | None = None) -> Entry:
        """Copy `source` into bundles/ (read once, so later changes of the source do not count) and return
        its entry. A copy already there is reused when its bytes hash right."""
        data = source.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        name = name or source.name
        entry = Entry(name, sha, f"{Path(name).stem[:80]}-{sha[:12]}.onnx")
        target = self.path(entry)
        if not (target.is_file() and file_sha256(target) == sha):
            _atomic_write(target, data)
        else:
            os.utime(target)  # a fresh copy for the age rule of `prune`
        return entry

    def commit(
        self, base: int, action: str, live: Entry, by: str | None = None, **details: Any
    ) -> dict[str, Any]:
        """Write generation base + 1 with `live` when `base` is still the current generation (else
        `StaleGeneration`). `action`: "start" (the first generation), "promote" (the live model goes on the
        roll-back history) or "rollback" (`live` must be the newest model of that history, which it leaves).
        Once the generation is written nothing raises: the log line and the clean-up are logged on failure."""
        with self._locked():
            current = self._newest()
            number = current["generation"] if current is not None else 0
            if base != number:
                assert current is not None
                raise StaleGeneration(base, current)
            before = [Entry.of(item) for item in current["stack"]] if current is not None else []
            if action == "promote" and current is not None:
                stack = [Entry.of(current["live"]), *before][: self.keep]
            elif action == "rollback":
                if not before or before[0].sha256 != live.sha256:
                    raise StoreError("nothing to roll back to: no model was promoted over this one")
                stack = before[1:]
            else:
                stack = []
            self.verified(live)
            record = {
                "generation": number + 1,
                "action": action,
                **_origin(by),
                "forced": bool(details.pop("forced", False)),
                "live": live.to_dict(),
                "from": current["live"] if current is not None else None,
                "stack": [entry.to_dict() for entry in stack],
                **details,
            }
            text = json.dumps(record, indent=1)
            _atomic_write(self.generations / f"{number + 1:08d}.json", text.encode())
            _atomic_write(self.root / "current", text.encode())
            self._after_commit(record, {live.file, *(entry.file for entry in stack)})
        logger.info("store generation %d: %s %s (%s)", number + 1, action, live.name, live.version)
        return record

    def _newest(self) -> dict[str, Any] | None:
        """The current generation, or a newer one history/ holds (a change stopped between its two writes)."""
        current, newest = self.current(), self.newest_generation()
        if newest is not None and (current is None or newest["generation"] > current["generation"]):
            return newest
        return current

    def _after_commit(self, record: dict[str, Any], referenced: set[str]) -> None:
        """The log line and the clean-up of a committed generation: a failure is logged, never raised."""
        try:
            if record["action"] != "start":
                self.log(_log_line(record))
        except OSError as error:
            logger.error("generation %d: %s not written (%s)", record["generation"], LOG_FILE, error)
        try:
            self.prune(referenced)
        except Exception:  # the generation is committed: a clean-up that fails waits for the next one
            logger.exception("generation %d: removing unused bundle copies failed", record["generation"])

    def prune(self, referenced: set[str]) -> list[str]:
        """Remove bundle files the current generation no longer refers to: models that fell off the
        roll-back history or were rolled back from at once, staged copies after `STAGED_MAX_AGE_S`."""
        removed = []
        now = time.time()
        remembered = set()
        for record in self.history(limit=self.keep * 4 + 8):
            remembered.update(item["file"] for item in [record["live"], *record.get("stack", [])])
        for path in self.bundles.glob("*.onnx"):
            if path.name in referenced:
                continue
            try:
                age = now - path.stat().st_mtime
                if (path.name in remembered and age > RECENT_S) or age > STAGED_MAX_AGE_S:
                    path.unlink()
                    removed.append(path.name)
            except FileNotFoundError:
                continue
        return removed

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with _IN_PROCESS, open(self.root / ".lock", "a+b") as handle:
            fcntl.lockf(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.lockf(handle, fcntl.LOCK_UN)

    def log(self, line: dict[str, Any]) -> None:
        """Append one line to promotions.jsonl (fsynced): a change or a shadow started or stopped."""
        with open(self.root.parent / LOG_FILE, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def mark_shadow(self, owner: str, entry: Entry | None, by: str | None = None) -> None:
        """Note in shadows/ the model the process `owner` runs in shadow (None: none any more), so that a
        replica without it can say where it runs. A shadow is per process: its figures are its images."""
        folder = self.root / SHADOWS_DIR
        path = folder / f"{_PLAIN.sub('_', owner)}.json"
        if entry is None:
            path.unlink(missing_ok=True)
            return
        folder.mkdir(exist_ok=True)
        _atomic_write(path, json.dumps({**entry.to_dict(), **_origin(by)}).encode())

    def shadows(self) -> list[dict[str, Any]]:
        """The shadows processes on the store run, as they noted them (a process of this host that is gone is
        left out, its note removed; the notes of other hosts cannot be checked and show their time)."""
        found = []
        host = socket.gethostname()
        for path in sorted((self.root / SHADOWS_DIR).glob("*.json")):
            try:
                note = json.loads(path.read_text(encoding="utf-8"))
                alive = note["host"] != host or _alive(int(note["pid"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if alive:
                found.append(note)
            else:
                path.unlink(missing_ok=True)
        return found

    def log_event(self, action: str, by: str | None, **details: Any) -> dict[str, Any]:
        """Record a change that is no generation (a shadow started or stopped): who, when, from where."""
        line = {"action": action, **_origin(by), "forced": False, **details}
        self.log(line)
        return line


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _origin(by: str | None) -> dict[str, Any]:
    """Who (never empty), when and from where (host, pid) of a change."""
    return {
        "time": _iso(time.time()),
        "by": by or "unnamed",
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def _log_line(record: dict[str, Any]) -> dict[str, Any]:
    """A generation as promotions.jsonl records it: who, when, from where, forced or not, from and to."""
    keys = ("generation", "time", "action", "by", "host", "pid", "client", "from", "shadow", "compare")
    line = {key: record[key] for key in keys if key in record}
    line["forced"] = bool(record.get("forced"))
    line["to"] = record["live"]
    line["previous_file"] = f"{STORE_DIR}/bundles/{record['stack'][0]['file']}" if record["stack"] else None
    return line


def compare_verdict(folder: Path, old_sha: str, new_sha: str) -> dict[str, Any] | None:
    """The newest `defectdet compare` verdict on OLD = `old_sha`, NEW = `new_sha` among the compare.json
    files in `folder` and its sub-folders two levels down (its `store/` left out); None when there is none. Its
    decision is the promotion rule applied again to the file's recorded figures (`runtime.compare_rule`), never
    the decision as written: an edited verdict answers keep, saying so."""
    found: list[tuple[float, dict[str, Any]]] = []
    patterns = (COMPARE_FILE, f"*/{COMPARE_FILE}", f"*/*/{COMPARE_FILE}")
    for path in (path for pattern in patterns for path in folder.glob(pattern)):
        if path.relative_to(folder).parts[0] == STORE_DIR or not path.is_file():
            continue
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            models, verdict = document["models"], document["verdict"]
            pair = (_model_sha(models["old"], path), _model_sha(models["new"], path))
            decision = verdict["decision"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
            logger.debug("%s: not a compare verdict (%s)", path, error)
            continue
        if pair == (old_sha, new_sha):
            summary = {"decision": decision, "file": str(path.relative_to(folder))}
            found.append((path.stat().st_mtime, {**summary, **_checked(document, decision)}))
    return max(found, key=lambda item: item[0])[1] if found else None


def _checked(document: dict[str, Any], recorded: Any) -> dict[str, Any]:
    """The verdict's decision and reasons as the promotion rule gives them on the file's recorded figures: a
    decision that does not follow from them (edited by hand, or written by another rule) is not trusted, and
    neither is a file without figures; both are answered as keep, saying why."""
    try:
        verdict = verdict_from_document(document)
    except (KeyError, TypeError, ValueError, DefectDetError) as error:
        return {
            "decision": KEEP,
            "reasons": [f"the verdict cannot be checked: its figures are missing or malformed ({error})"],
        }
    if verdict["decision"] != recorded:
        return {
            "decision": KEEP,
            "recorded_decision": recorded,
            "reasons": [
                f"the recorded verdict {recorded!r} does not follow from the recorded figures (the rule gives "
                f"{verdict['decision']!r}): the file was edited or written by another rule; run compare again",
                *verdict["reasons"][:5],
            ],
        }
    return {"decision": verdict["decision"], "reasons": list(verdict["reasons"])[:6]}


def _model_sha(model: dict[str, Any], document: Path) -> str | None:
    """A compared model's sha256: as compare.json records it, else of its bundle file when that is there."""
    if model.get("sha256"):
        return str(model["sha256"])
    bundle = Path(str(model.get("bundle", "")))
    for candidate in (bundle, document.parent / bundle.name):
        if candidate.is_file():
            return file_sha256(candidate)
    return None


def _atomic_write(target: Path, data: bytes) -> None:
    """Write through a temporary file in the target's folder, fsync, then rename over the target."""
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")
