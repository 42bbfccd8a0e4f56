"""The labels download is built beside the images it packs, never in /tmp (a container's /tmp is a small
emptyDir), and a download a crash left behind is cleaned up."""

from __future__ import annotations

import os
import tempfile
import time
import zipfile
from pathlib import Path

import pytest
from server_fakes import board, encode

from defectdet.serve.review import ReviewFolder
from defectdet.serve.review_download import write_dataset_zip


def _reviewed_folder(root: Path) -> ReviewFolder:
    (root / "images").mkdir(parents=True)
    (root / "images" / "a.png").write_bytes(encode(board(1)))
    folder = ReviewFolder(root, ["open", "short"], operator="ann")
    folder.decide("a.png", "accept", [{"class_id": 1, "box": [5, 5, 30, 30]}])
    return folder


def test_the_download_is_built_in_the_review_folder_not_in_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _reviewed_folder(tmp_path / "kept")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-tmp"))  # a /tmp with no room: not there
    path, count = write_dataset_zip(folder)
    assert path.parent == folder.root and path.name.startswith(".") and count == 1
    with zipfile.ZipFile(path) as archive:
        assert {"images/a.png", "labels/a.txt", "left_out.txt"} <= set(archive.namelist())
        assert not [name for name in archive.namelist() if name.startswith(".")]
    path.unlink()
    assert [item["name"] for item in folder.listing()["items"]] == ["a.png"]


def test_a_download_left_by_a_crash_is_removed_by_the_next_once_an_hour_old(tmp_path: Path) -> None:
    folder = _reviewed_folder(tmp_path / "kept")
    stale, recent = folder.root / ".download-old.zip.tmp", folder.root / ".download-now.zip.tmp"
    stale.write_bytes(b"torn")
    recent.write_bytes(b"being sent")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    path, _ = write_dataset_zip(folder)
    assert not stale.exists() and recent.exists() and path.exists()
