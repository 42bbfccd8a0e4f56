"""Read every sample in a forked child process, as a DataLoader worker would, and report what goes wrong:
a sample that raises, one that kills its process (which signal), one that hangs, a batch that cannot be
collated, and the samples whose shapes differ from the rest."""

from __future__ import annotations

import dataclasses
import faulthandler
import logging
import multiprocessing
import signal
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

SIGNAL_MEANINGS = {
    "SIGKILL": "killed, usually by the kernel's out-of-memory killer: the sample (or the batch) needs too much RAM",
    "SIGSEGV": "crashed in native code (OpenCV, NumPy, a codec): often a corrupt image file",
    "SIGBUS": "bus error: shared memory (/dev/shm) is full or too small for the batch",
    "SIGABRT": "aborted by a C/C++ assertion inside a library",
}


@dataclasses.dataclass
class SampleProblem:
    """`kind`: error | died | hang | collate | shape | unreadable."""

    kind: str
    index: int
    file: str | None
    message: str
    indices: list[int] = dataclasses.field(default_factory=list)  # the batch, for collate problems


@dataclasses.dataclass
class ScanResult:
    scanned: int
    signatures: dict[int, str]
    problems: list[SampleProblem]
    seconds: float
    stopped_early: str = ""


def signature(item: Any) -> str:
    """'tensor[2, 64, 64] float32, tensor[3, 5] float32, dict' style description of a sample's structure."""
    if item is None:
        return "None"
    if isinstance(item, torch.Tensor | np.ndarray):
        kind = "tensor" if isinstance(item, torch.Tensor) else "ndarray"
        return f"{kind}{list(item.shape)} {str(item.dtype).replace('torch.', '')}"
    if isinstance(item, dict):
        if not _has_array(item):
            return "dict"
        return (
            "{"
            + ", ".join(f"{key}: {signature(value)}" for key, value in item.items() if _has_array(value))
            + "}"
        )
    if isinstance(item, list | tuple):
        return "(" + ", ".join(signature(value) for value in item) + ")"
    return type(item).__name__


def _has_array(value: Any) -> bool:
    if isinstance(value, torch.Tensor | np.ndarray):
        return True
    if isinstance(value, dict | list | tuple):
        return any(_has_array(item) for item in (value.values() if isinstance(value, dict) else value))
    return False


def batch_signature(item: Any) -> str:
    """The signature with per-sample box counts masked: target tensors [N, 5] legitimately differ in N."""
    if (
        isinstance(item, list | tuple)
        and len(item) >= 2
        and isinstance(item[1], torch.Tensor)
        and item[1].dim() == 2
    ):
        return signature((item[0], "targets", *item[2:]))
    return signature(item)


def sample_file(dataset: Any, index: int, item: Any = None) -> str | None:
    """The file behind sample `index`: `dataset.samples[index].image_path`, or an 'image_path' in the item."""
    samples = getattr(dataset, "samples", None)
    if samples is not None and index < len(samples) and hasattr(samples[index], "image_path"):
        return str(samples[index].image_path)
    for part in item if isinstance(item, list | tuple) else [item]:
        if isinstance(part, dict) and "image_path" in part:
            return str(part["image_path"])
    return None


class _LastWarning(logging.Handler):
    """Keeps the last warning logged while one sample is read (e.g. why an image was skipped)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.last = record.getMessage()


def _child(
    connection: Any,
    dataset: Any,
    indices: Sequence[int],
    batch_size: int,
    collate_fn: Callable | None,
    crash_log: Any,
) -> None:
    if crash_log is not None:
        faulthandler.enable(crash_log)  # a native crash writes the Python stack where it happened
    warnings = _LastWarning()
    logging.getLogger().handlers = [
        warnings
    ]  # this child only: the dataset's warnings become the scan's notes
    batch: list[tuple[int, Any]] = []

    def collate() -> None:
        if collate_fn is None or not batch:
            return
        try:
            collate_fn([item for _, item in batch])
        except Exception as error:  # report and continue: the scan is about finding every problem
            connection.send(("collate", [index for index, _ in batch], f"{type(error).__name__}: {error}"))
        batch.clear()

    for index in indices:
        connection.send(("start", index))
        warnings.last = None
        try:
            item = dataset[index]
        except Exception as error:
            where = traceback.extract_tb(error.__traceback__)[-1]
            connection.send(
                ("error", index, f"{type(error).__name__}: {error} ({where.filename}:{where.lineno})")
            )
            continue
        note = warnings.last if item is None else None
        connection.send(("done", index, batch_signature(item), sample_file(dataset, index, item), note))
        batch.append((index, item))
        if len(batch) == batch_size:
            collate()
    collate()
    connection.send(("end",))
    connection.close()


def _signal_message(exitcode: int | None, crash_log: Any) -> str:
    if exitcode is None or exitcode >= 0:
        message = f"the process exited with code {exitcode}"
    else:
        name = signal.Signals(-exitcode).name
        message = f"{name}: {SIGNAL_MEANINGS.get(name, 'killed by a signal')}"
    if crash_log is None:
        return message
    crash_log.seek(0)
    frames = [
        line.strip()
        for line in crash_log.read().decode(errors="replace").splitlines()
        if line.strip().startswith("File ")
    ]
    return message + (f"; crashed at {frames[0]}" if frames else "")


@dataclasses.dataclass
class _Seen:
    """What a scan has found so far: per index the item's signature, file and note, and the problems."""

    signatures: dict[int, str]
    files: dict[int, str | None]
    notes: dict[int, str]
    problems: list[SampleProblem]


def _follow_child(
    receiver: Any, process: Any, dataset: Any, sample_timeout: float, crash_log: Any, seen: _Seen
) -> tuple[int | None, bool]:
    """Record one scanning child's messages until it ends, dies or hangs (killed after `sample_timeout`).
    Returns the index it was on when it died or hung (None when between samples) and whether it finished."""
    problems = seen.problems
    current, finished = None, False
    while True:
        if not receiver.poll(sample_timeout):
            process.kill()
            if current is not None:
                problems.append(
                    SampleProblem(
                        "hang",
                        current,
                        sample_file(dataset, current),
                        f"no result after {sample_timeout:g} s",
                    )
                )
            break
        try:
            message = receiver.recv()
        except EOFError:  # the child died
            process.join(5)
            if current is not None:
                problems.append(
                    SampleProblem(
                        "died",
                        current,
                        sample_file(dataset, current),
                        _signal_message(process.exitcode, crash_log),
                    )
                )
            break
        if message[0] == "start":
            current = message[1]
        elif message[0] == "done":
            seen.signatures[message[1]], seen.files[message[1]], current = message[2], message[3], None
            if message[4]:
                seen.notes[message[1]] = message[4]
        elif message[0] == "error":
            problems.append(SampleProblem("error", message[1], sample_file(dataset, message[1]), message[2]))
            current = None
        elif message[0] == "collate":
            problems.append(SampleProblem("collate", message[1][0], None, message[2], list(message[1])))
        elif message[0] == "end":
            finished = True
            break
    return current, finished


def scan_samples(
    dataset: Any,
    indices: Sequence[int] | None = None,
    batch_size: int = 8,
    collate_fn: Callable | None = None,
    sample_timeout: float = 30.0,
    max_failures: int = 3,
) -> ScanResult:
    """Scan `indices` (default all) in a child process; a child that dies or hangs is replaced and the scan
    goes on after the culprit, until `max_failures` such failures."""
    context = multiprocessing.get_context(
        "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    )
    pending = list(range(len(dataset)) if indices is None else indices)
    signatures: dict[int, str] = {}
    files: dict[int, str | None] = {}
    notes: dict[int, str] = {}
    problems: list[SampleProblem] = []
    seen = _Seen(signatures, files, notes, problems)
    failures, start, stopped = 0, time.perf_counter(), ""
    while pending:
        receiver, sender = context.Pipe(duplex=False)
        crash_log = tempfile.TemporaryFile() if context.get_start_method() == "fork" else None
        process = context.Process(
            target=_child, args=(sender, dataset, pending, batch_size, collate_fn, crash_log), daemon=True
        )
        process.start()
        sender.close()
        current, finished = _follow_child(receiver, process, dataset, sample_timeout, crash_log, seen)
        process.join(5)
        receiver.close()
        if crash_log is not None:
            crash_log.close()
        if finished or current is None:
            break
        failures += 1
        pending = pending[pending.index(current) + 1 :]
        if failures >= max_failures:
            stopped = f"stopped after {failures} dead or hung processes; {len(pending)} sample(s) not scanned"
            break
    problems += shape_outliers(signatures, files, notes)
    _explain_collate(problems, signatures, files)
    return ScanResult(len(signatures), signatures, problems, time.perf_counter() - start, stopped)


def shape_outliers(
    signatures: dict[int, str], files: dict[int, str | None], notes: dict[int, str] | None = None
) -> list[SampleProblem]:
    """Samples whose structure/shape differs from the most common one (None items are unreadable images;
    `notes` holds the warning the dataset logged for them)."""
    readable = {index: sig for index, sig in signatures.items() if sig != "None"}
    notes = notes or {}
    problems = [
        SampleProblem(
            "unreadable",
            index,
            files.get(index),
            "returned None (unreadable image): skipped in batches"
            + (f"; the dataset logged: {notes[index]}" if index in notes else ""),
        )
        for index, sig in signatures.items()
        if sig == "None"
    ]
    if not readable:
        return problems
    common, count = Counter(readable.values()).most_common(1)[0]
    for index, sig in sorted(readable.items()):
        if sig != common:
            problems.append(
                SampleProblem(
                    "shape", index, files.get(index), f"{sig} where {count} other sample(s) give {common}"
                )
            )
    return problems


def _explain_collate(
    problems: list[SampleProblem], signatures: dict[int, str], files: dict[int, str | None]
) -> None:
    """Point each collate failure at the odd sample(s) of its batch."""
    odd = {problem.index for problem in problems if problem.kind == "shape"}
    for problem in problems:
        if problem.kind != "collate":
            continue
        culprits = [index for index in problem.indices if index in odd]
        if culprits:
            problem.index = culprits[0]
            problem.file = files.get(culprits[0])
            problem.message += (
                f" (odd sample(s) in this batch: {', '.join(map(str, culprits))}: {signatures[culprits[0]]})"
            )
