"""The processes of `serve --workers N`: tied to their parent, one shared state folder, drift resets for all.

- A worker ends when the `serve` parent ends, however it ends (`kill -9` included): on Linux the kernel sends
  it SIGTERM (`prctl(PR_SET_PDEATHSIG)`), and on every system a watchdog thread sees the parent's pid change
  and does the same, then exits hard if the graceful stop has not finished in `STOP_GRACE_S`.
- The state folder (`defectdet-metrics-<parent pid>-*` in the temporary folder, or `PROMETHEUS_MULTIPROC_DIR`)
  holds every worker's Prometheus values and the drift-reset broadcast. The parent removes it when it stops;
  a folder left by a parent that was killed is removed by the next `serve --workers` start.
- Drift charts are kept per worker; a reset on any worker writes `drift-reset` in the state folder, and every
  worker polls it (`DriftBroadcast`, every `POLL_S`) and restarts its own charts.

No torch import.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

STATE_PREFIX = "defectdet-metrics-"
_STATE_NAME = re.compile(rf"^{re.escape(STATE_PREFIX)}(\d+)-")
PR_SET_PDEATHSIG = 1
POLL_S = 0.5
STOP_GRACE_S = 10.0
RESET_FILE = "drift-reset"


def state_folder_name(parent: int) -> str:
    """The prefix of the state folder of the `serve` process `parent`."""
    return f"{STATE_PREFIX}{parent}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_state(folder: str | Path) -> list[Path]:
    """Remove the state folders in `folder` whose `serve` parent is gone (killed before it could clean up);
    the folders removed."""
    removed = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    for path in entries:
        match = _STATE_NAME.match(path.name)
        if match is None or not path.is_dir() or _alive(int(match.group(1))):
            continue
        try:
            if path.stat().st_uid != os.getuid():
                continue
        except (OSError, AttributeError):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
        logger.info("removed %s, left by a serve process that was killed", path)
    return removed


def bind_to_parent(parent: int) -> None:
    """Make this worker stop when the process `parent` ends (see the module docstring)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
                logger.debug("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        except (OSError, AttributeError) as error:
            logger.debug("prctl unavailable: %s", error)
    threading.Thread(target=_watch_parent, args=(parent,), name="defectdet-parent", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    logger.warning("the serve process %d is gone: worker %d stops", parent, os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(STOP_GRACE_S)
    os._exit(1)


class DriftBroadcast:
    """The drift-reset file in the state folder: `announce()` writes a new token, and a poller thread calls
    `on_reset()` in every worker whose last seen token differs (the announcing worker included)."""

    def __init__(self, folder: str | Path, on_reset: Callable[[], None], poll_s: float = POLL_S) -> None:
        self.path = Path(folder) / RESET_FILE
        self.on_reset = on_reset
        self.poll_s = poll_s
        self.seen = self._read()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> str:
        try:
            return self.path.read_text()
        except OSError:
            return ""

    def announce(self) -> None:
        """Ask every worker to reset its drift charts (this one resets at once)."""
        token = f"{time.time():.6f} {os.getpid()} {uuid.uuid4().hex}"
        temporary = self.path.with_name(f".{RESET_FILE}.{uuid.uuid4().hex[:6]}.tmp")
        temporary.write_text(token)
        os.replace(temporary, self.path)
        self.check()

    def check(self) -> bool:
        """Reset when the token changed since this worker last looked; True when it did."""
        token = self._read()
        if token == self.seen:
            return False
        self.seen = token
        self.on_reset()
        return True

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="defectdet-drift-reset", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except Exception as error:  # never let the poller die
                logger.warning("drift reset broadcast: %s", error)
