"""`serve --keep`: the capture policies, atomic items with sidecars, the disk cap, and capture through the service."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from server_fakes import FakePredictor, board, encode

from defectdet.runtime.predictor import Detection, PredictionResult
from defectdet.serve import capture as capture_module
from defectdet.serve.capture import Capture, KeptItem, keep_reasons, parse_keep
from defectdet.serve.server import create_app
from defectdet.serve.settings import ServeSettings


def _result(scores: list[float], threshold: float = 0.5) -> PredictionResult:
    detections = [Detection((1.0, 1.0, 5.0, 5.0), 0, "open", score) for score in scores]
    verdict = "defective" if any(score >= threshold for score in scores) else "clean"
    return PredictionResult(detections, verdict, threshold, (10, 10), {})


def test_parse_keep_takes_repeats_and_commas_and_refuses_unknown_names() -> None:
    assert parse_keep(["flagged,drift", "uncertain", "flagged"]) == ("flagged", "drift", "uncertain")
    assert parse_keep(["none"]) == () and parse_keep([]) == ()
    with pytest.raises(ValueError, match="unknown policy 'flaged'"):
        parse_keep(["flaged"])
    with pytest.raises(ValueError, match="'none' cannot be combined"):
        parse_keep("none,all")
    with pytest.raises(ValueError, match="--keep-dir"):
        ServeSettings(keep=("all",))


@pytest.mark.parametrize(
    ("policies", "scores", "drift", "expected"),
    [
        (("all",), [], "ok", ["all"]),
        (("flagged",), [0.9], "ok", ["flagged"]),
        (("flagged",), [0.3], "ok", []),
        (("uncertain",), [0.45], "ok", ["uncertain"]),  # below the threshold, within the margin
        (("uncertain",), [0.58], "ok", ["uncertain"]),  # above it, within the margin
        (("uncertain",), [0.9, 0.2], "ok", []),  # far on both sides
        (("drift",), [], "warn", ["drift"]),
        (("drift",), [], "alert", ["drift"]),
        (("drift",), [], "ok", []),
        (("drift",), [], "unknown", []),
        (("flagged", "uncertain", "drift"), [0.55], "warn", ["flagged", "uncertain", "drift"]),
    ],
)
def test_keep_reasons_per_policy(
    policies: tuple[str, ...], scores: list[float], drift: str, expected: list[str]
) -> None:
    assert keep_reasons(policies, _result(scores), drift, stored_threshold=0.5, margin=0.1) == expected


def _kept_files(folder: Path) -> list[Path]:
    """The kept images, templates and sidecars (the cap counts these; the lock and change mark are not items)."""
    return [path for sub in ("images", "templates", "predictions") for path in (folder / sub).glob("*")]


def _item(size: int = 1000, template: bool = False) -> KeptItem:
    image = b"\x89PNG\r\n\x1a\n" + bytes(size - 8)  # a PNG signature: kept as .png
    return KeptItem(
        image, image if template else None, {"time": 1_700_000_000.0, "reasons": ["all"], "verdict": "clean"}
    )


def test_an_item_is_the_uploaded_bytes_a_template_and_a_sidecar_written_last(tmp_path: Path) -> None:
    data = encode(board(1))
    capture = Capture(tmp_path)
    name = capture.write(KeptItem(data, data[::-1], {"time": 1.0, "reasons": ["flagged"], "verdict": "x"}))
    assert name is not None and name.startswith("19700101T000001Z-")
    assert (tmp_path / "images" / f"{name}.png").read_bytes() == data
    assert (tmp_path / "templates" / f"{name}.bin").read_bytes() == data[::-1]  # not an image format: .bin
    sidecar = json.loads((tmp_path / "predictions" / f"{name}.json").read_text())
    assert sidecar["reasons"] == ["flagged"] and sidecar["image"] == f"images/{name}.png"
    assert sidecar["template"] == f"templates/{name}.bin"
    assert not list(tmp_path.rglob("*.tmp"))
    assert capture.bytes == sum(path.stat().st_size for path in _kept_files(tmp_path))


def test_a_failed_replace_leaves_no_partial_item(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    capture = Capture(tmp_path)
    calls = {"n": 0}
    real_replace = capture_module.os.replace

    def replace_then_fail(source: str, target: str) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the sidecar's move fails (disk full)
            raise OSError(28, "No space left on device")
        real_replace(source, target)

    monkeypatch.setattr(capture_module.os, "replace", replace_then_fail)
    with pytest.raises(OSError, match="No space"):
        capture.write(_item(500))
    assert not _kept_files(tmp_path)  # image removed, no temp file left
    assert capture.bytes == 0 and not capture.items


def test_an_items_files_are_flushed_to_disk_at_once_before_any_is_moved_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capture = Capture(tmp_path)
    together = threading.Barrier(3, timeout=10)  # passes only when the three fsyncs run at the same time
    real_fsync = os.fsync
    seen: list[int] = []

    def fsync_together(descriptor: int) -> None:
        in_place = [path for path in _kept_files(tmp_path) if not path.name.startswith(".")]
        seen.append(len(in_place))  # nothing of the item is in place yet (only its temporary files)
        together.wait()
        real_fsync(descriptor)

    monkeypatch.setattr(capture_module.os, "fsync", fsync_together)
    name = capture.write(_item(700, template=True))
    assert seen == [0, 0, 0] and name is not None
    assert len(_kept_files(tmp_path)) == 3 and not list(tmp_path.rglob("*.tmp"))


def test_a_failed_fsync_leaves_no_partial_item(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    capture = Capture(tmp_path)
    real_fsync = os.fsync
    calls = {"n": 0}

    def fail_one(descriptor: int) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(5, "Input/output error")
        real_fsync(descriptor)

    monkeypatch.setattr(capture_module.os, "fsync", fail_one)
    with pytest.raises(OSError, match="Input/output"):
        capture.write(_item(700, template=True))
    assert not _kept_files(tmp_path) and not list(tmp_path.rglob("*.tmp"))
    assert capture.bytes == 0 and not capture.items


def test_the_change_mark_is_rewritten_in_place_over_any_earlier_one(tmp_path: Path) -> None:
    first, second = Capture(tmp_path), Capture(tmp_path)
    (tmp_path / capture_module.GENERATION_FILE).write_text(f"4194303-{'f' * 32}")  # an older writer's, longer
    assert first.write(_item(600)) is not None
    assert (tmp_path / capture_module.GENERATION_FILE).read_text() == first._generation
    assert second.write(_item(600)) is not None  # sees the other writer's item before its own
    assert len(second.items) == 2
    assert second.bytes == sum(path.stat().st_size for path in _kept_files(tmp_path))


def test_items_that_queue_up_are_written_under_one_lock_and_one_change_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capture = Capture(tmp_path)
    marks = {"n": 0}
    real_changed = capture._changed

    def counted_changed() -> None:
        marks["n"] += 1
        real_changed()

    monkeypatch.setattr(capture, "_changed", counted_changed)
    with capture_module.folder_lock(tmp_path / capture_module.LOCK_FILE):  # another writer holds the folder
        assert all(capture.submit(_item(600)) for _ in range(6))
        time.sleep(0.05)
    capture.drain()
    assert len(list((tmp_path / "predictions").iterdir())) == 6 and capture.counts["kept:all"] == 6
    assert marks["n"] <= 2  # the first item the writer took, then the five queued behind it together


def test_a_failing_item_in_a_batch_is_counted_and_the_others_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capture = Capture(tmp_path)
    real_write = capture._write

    def fail_the_second(item: KeptItem) -> str | None:
        if item.sidecar.get("verdict") == "broken":
            raise OSError(5, "Input/output error")
        return real_write(item)

    monkeypatch.setattr(capture, "_write", fail_the_second)
    items = [_item(600) for _ in range(3)]
    items[1].sidecar["verdict"] = "broken"
    capture.write_all(items)
    assert len(list((tmp_path / "predictions").iterdir())) == 2
    assert capture.counts["error"] == 1 and capture.counts["kept:all"] == 2


def test_an_item_the_full_queue_turns_away_is_counted_never_silently_lost(tmp_path: Path) -> None:
    capture = Capture(tmp_path, queue_size=2)
    with capture_module.folder_lock(tmp_path / capture_module.LOCK_FILE):  # the writer cannot write meanwhile
        accepted = [capture.submit(_item(600)) for _ in range(6)]
    capture.drain()
    written = len(list((tmp_path / "predictions").iterdir()))
    assert written == accepted.count(True) and accepted.count(False) == capture.counts["dropped:queue"] > 0


def test_a_full_queue_warns_once_with_the_count_not_once_per_answer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    capture = Capture(tmp_path, queue_size=1)
    with caplog.at_level(logging.WARNING), capture_module.folder_lock(tmp_path / capture_module.LOCK_FILE):
        accepted = [capture.submit(_item(600)) for _ in range(8)]
    capture.drain()
    warnings = [record.getMessage() for record in caplog.records if "keep queue full" in record.getMessage()]
    assert accepted.count(False) == capture.counts["dropped:queue"] >= 5
    assert len(warnings) == 1 and "1 answer(s) not kept" in warnings[0]


def test_the_disk_cap_deletes_the_oldest_unreviewed_items_and_never_exceeds(tmp_path: Path) -> None:
    capture = Capture(tmp_path, max_bytes=5000)
    names = []
    for index in range(8):
        item = _item(1000)
        item.sidecar["time"] = 1_700_000_000.0 + index
        names.append(capture.write(item))
        on_disk = sum(path.stat().st_size for path in _kept_files(tmp_path))
        assert on_disk <= 5000 and on_disk == capture.bytes
    kept = sorted(path.stem for path in (tmp_path / "images").iterdir())
    assert kept == names[-len(kept) :] and len(kept) < 8  # the newest stay
    assert capture.counts["evicted"] == 8 - len(kept)


def test_at_the_cap_a_new_item_looks_only_at_the_oldest_items_not_the_whole_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capture = Capture(tmp_path, max_bytes=200 * 1000)
    for index in range(200):
        item = _item(1000)
        item.sidecar["time"] = 1_700_000_000.0 + index
        capture.write(item)
    looked_at = {"n": 0}

    class CountingSet(frozenset):
        def __contains__(self, name: object) -> bool:
            looked_at["n"] += 1
            return super().__contains__(name)

    monkeypatch.setattr(capture, "_decided_names", lambda: CountingSet())
    oldest = next(iter(capture.items))
    assert capture.write(_item(1000)) is not None
    assert oldest not in capture.items and capture.bytes <= 200 * 1000
    assert looked_at["n"] < 10  # the oldest few; walking all 200 items on every write made the cap O(folder)


def test_reviewed_items_are_never_deleted_so_the_cap_stops_keeping(tmp_path: Path) -> None:
    capture = Capture(tmp_path, max_bytes=3000)
    first = capture.write(_item(1000))
    second = capture.write(_item(1000))
    (tmp_path / "labels").mkdir()
    for name in (first, second):
        (tmp_path / "labels" / f"{name}.txt").write_text("0 0.5 0.5 0.1 0.1\n")
    assert capture.write(_item(1000)) is None
    assert capture.counts["dropped:cap"] == 1
    assert sorted(path.stem for path in (tmp_path / "images").iterdir()) == sorted([first, second])
    assert capture.write(_item(5000)) is None  # larger than the whole cap


def test_a_restart_counts_what_is_there_and_removes_torn_temporary_files(tmp_path: Path) -> None:
    Capture(tmp_path).write(_item(700, template=True))
    torn = tmp_path / "images" / ".x.png.abc123.tmp"
    torn.write_bytes(b"torn")
    writing = tmp_path / "images" / ".y.png.def456.tmp"  # another process may be writing this one now
    writing.write_bytes(b"new")
    os.utime(torn, (time.time() - 7200, time.time() - 7200))  # a crash's, an hour old
    again = Capture(tmp_path, max_bytes=10_000)
    assert writing.exists()
    writing.unlink()
    assert len(again.items) == 1 and again.bytes == sum(path.stat().st_size for path in _kept_files(tmp_path))
    assert not list(tmp_path.rglob("*.tmp"))


# ------------------------------------------------------------------ through the service
@pytest.fixture
def keep_client(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[TestClient]:
    policies, score = getattr(request, "param", (("flagged",), 0.9))
    settings = ServeSettings(keep=policies, keep_dir=str(tmp_path / "kept"))
    app = create_app(FakePredictor(score=score), settings)
    with TestClient(app, base_url="http://localhost") as client:
        assert app.state.service.ready.wait(30)
        yield client


def _detect(client: TestClient, blob: bool = True) -> dict:
    response = client.post("/v1/detect", files={"image": encode(board(3, blob=blob))})
    assert response.status_code == 200, response.text
    return response.json()


def test_flagged_answers_are_kept_with_a_sidecar_and_counted(keep_client: TestClient, tmp_path: Path) -> None:
    assert _detect(keep_client)["kept"] is True
    assert _detect(keep_client, blob=False)["kept"] is False
    service = keep_client.app.state.service
    service.capture.drain()
    (sidecar_path,) = (tmp_path / "kept" / "predictions").iterdir()
    sidecar = json.loads(sidecar_path.read_text())
    assert sidecar["reasons"] == ["flagged"] and sidecar["verdict"] == "defective"
    assert sidecar["detections"][0]["class_name"] == "short"
    assert len(sidecar["bundle_sha256"]) == 64 and sidecar["bundle_sha256"].startswith(
        sidecar["model_version"]
    )
    assert sidecar["stored_threshold"] == 0.25 and sidecar["drift"]["level"] in ("ok", "warn", "alert")
    assert sidecar["class_names"][1] == "short" and sidecar["time"] > 0
    image = tmp_path / "kept" / sidecar["image"]
    assert image.read_bytes() == encode(board(3))
    metrics = keep_client.get("/metrics").text
    assert 'defectdet_kept_total{reason="flagged"} 1.0' in metrics
    assert f"defectdet_kept_bytes {float(service.capture.bytes)}" in metrics


@pytest.mark.parametrize("keep_client", [(("uncertain",), 0.2)], indirect=True)
def test_uncertain_keeps_a_near_miss_but_answers_only_what_passes_the_threshold(
    keep_client: TestClient, tmp_path: Path
) -> None:
    body = _detect(keep_client)
    assert body["kept"] is True and body["verdict"] == "clean" and body["detections"] == []
    keep_client.app.state.service.capture.drain()
    (sidecar_path,) = (tmp_path / "kept" / "predictions").iterdir()
    sidecar = json.loads(sidecar_path.read_text())
    assert sidecar["reasons"] == ["uncertain"] and sidecar["detections"][0]["score"] == 0.2


@pytest.mark.parametrize("keep_client", [(("uncertain",), 0.12)], indirect=True)
def test_the_verdict_does_not_depend_on_keeping(keep_client: TestClient) -> None:
    """A 0.12 detection asked for at threshold 0.1 is defective with or without `--keep uncertain` (whose own
    floor, the stored 0.25 minus the 0.1 margin, lies above the request's threshold)."""
    image = encode(board(3))
    kept = keep_client.post("/v1/detect", files={"image": image}, data={"threshold": "0.1"}).json()
    plain_app = create_app(FakePredictor(score=0.12), ServeSettings())
    with TestClient(plain_app, base_url="http://localhost") as plain:
        assert plain_app.state.service.ready.wait(30)
        answer = plain.post("/v1/detect", files={"image": image}, data={"threshold": "0.1"}).json()
    assert answer["verdict"] == kept["verdict"] == "defective"
    assert [d["score"] for d in kept["detections"]] == [d["score"] for d in answer["detections"]] == [0.12]


JUST_UNDER = 0.25 - 4e-7  # FakePredictor's stored threshold is 0.25: rounded to 5 places this would be 0.25


@pytest.mark.parametrize("keep_client", [(("uncertain",), JUST_UNDER)], indirect=True)
def test_a_score_just_under_the_threshold_is_never_rounded_over_it(
    keep_client: TestClient, tmp_path: Path
) -> None:
    """Kept as uncertain: the sidecar, the review listing and the Label Studio tasks all keep the exact score,
    so the proposal stays under the threshold (hidden on the page, left out of the tasks)."""
    from defectdet.data.formats.labelstudio import export_tasks
    from defectdet.serve.review import ReviewFolder

    body = _detect(keep_client)
    assert body["kept"] is True and body["verdict"] == "clean" and body["detections"] == []
    keep_client.app.state.service.capture.drain()
    (sidecar_path,) = (tmp_path / "kept" / "predictions").iterdir()
    sidecar = json.loads(sidecar_path.read_text())
    assert sidecar["detections"][0]["score"] == JUST_UNDER < sidecar["threshold"] == 0.25
    (item,) = ReviewFolder(tmp_path / "kept").listing()["items"]
    assert item["predictions"][0]["score"] == JUST_UNDER < item["threshold"]
    export_tasks(tmp_path / "kept", tmp_path / "tasks.json")
    (task,) = json.loads((tmp_path / "tasks.json").read_text())
    assert "predictions" not in task or not task["predictions"][0]["result"]


def test_a_disk_error_never_fails_the_request(
    keep_client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def full(files: list[tuple[Path, bytes]], fsync_all: object = None) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(capture_module, "write_files", full)
    with caplog.at_level(logging.WARNING):
        assert _detect(keep_client)["kept"] is True  # queued; the write fails later, off the request
        keep_client.app.state.service.capture.drain()
    assert "could not keep an answer" in caplog.text and "No space" in caplog.text
    assert "defectdet_keep_errors_total 1.0" in keep_client.get("/metrics").text
    assert _detect(keep_client)["verdict"] == "defective"


def test_without_keep_the_answer_has_no_kept_field() -> None:
    app = create_app(FakePredictor(), ServeSettings())
    with TestClient(app, base_url="http://localhost") as client:
        assert app.state.service.ready.wait(30)
        assert "kept" not in _detect(client)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--keep", "flaged"], "unknown policy 'flaged'"),
        (["--keep", "all"], "--keep-dir"),
        (["--keep", "all", "--keep-dir", "k", "--keep-max-mb", "-1"], "keep_max_mb"),
    ],
)
def test_serve_refuses_bad_keep_options_before_loading_anything(
    options: list[str], words: str, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from defectdet.cli import app

    result = CliRunner().invoke(app, ["serve", str(tmp_path / "missing.onnx"), *options])
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.replace("│", " ").split())


def test_keep_and_review_run_on_a_real_bundle_with_torch_unimportable(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    import subprocess
    import sys

    from torch_blocker import BLOCK_TORCH

    from defectdet.data.formats import load_dataset

    sample = load_dataset(tiny_dataset, "val").samples[0]
    kept = tmp_path / "kept"
    script = (
        BLOCK_TORCH
        + f"""
import json, pathlib
from fastapi.testclient import TestClient
from defectdet.serve.server import create_app
from defectdet.serve.settings import ServeSettings
settings = ServeSettings(keep=("all", "uncertain"), keep_dir={str(kept)!r}, keep_margin=1.0)
app = create_app({str(bundle_path)!r}, settings)
with TestClient(app, base_url="http://localhost") as client:
    assert app.state.service.ready.wait(120)
    files = {{"image": open({str(sample.image_path)!r}, "rb").read(), "template": open({str(sample.template_path)!r}, "rb").read()}}
    body = client.post("/v1/detect", files=files).json()
    assert body["kept"] is True, body
    assert all(d["score"] >= body["threshold"] for d in body["detections"])
    app.state.service.capture.drain()
    (item,) = client.get("/v1/review/items").json()["items"]
    assert item["template"] and "all" in item["reasons"], item
    assert client.get("/v1/review/template/" + item["name"]).status_code == 200
assert "torch" not in sys.modules
print("ok")
"""
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "ok"
    (sidecar,) = (kept / "predictions").iterdir()
    assert json.loads(sidecar.read_text())["bundle"] == bundle_path.name


@pytest.mark.parametrize("keep_client", [(("all",), 0.9)], indirect=True)
def test_every_image_format_the_service_keeps_is_listed_for_review_and_by_predict(
    keep_client: TestClient, tmp_path: Path
) -> None:
    from defectdet.data.imageio import IMAGE_SUFFIXES
    from defectdet.runtime.predict import list_sources

    assert set(capture_module.EXTENSIONS.values()) <= IMAGE_SUFFIXES
    gray = board(4)
    for ext in (".pgm", ".pbm", ".png"):  # PGM and PBM bytes are kept as .pnm
        image = encode(np.where(gray > 128, 255, 0).astype(np.uint8) if ext == ".pbm" else gray, ext)
        response = keep_client.post("/v1/detect", files={"image": image})
        assert response.status_code == 200 and response.json()["kept"] is True, response.text
    keep_client.app.state.service.capture.drain()
    on_disk = sorted(path.name for path in (tmp_path / "kept" / "images").iterdir())
    listed = sorted(item["name"] for item in keep_client.get("/v1/review/items").json()["items"])
    assert listed == on_disk and sum(name.endswith(".pnm") for name in listed) == 2, (listed, on_disk)
    extra = tmp_path / "kept" / "images" / "hand.pbm"
    extra.write_bytes(encode(np.where(gray > 128, 255, 0).astype(np.uint8), ".pbm"))
    assert "hand.pbm" in [item["name"] for item in keep_client.get("/v1/review/items").json()["items"]]
    assert len(list_sources(tmp_path / "kept" / "images")) == 4


def test_keep_has_a_default_cap_and_the_cap_warns_when_it_deletes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = ServeSettings(keep=("all",), keep_dir=str(tmp_path / "kept"))
    assert settings.keep_max_mb == capture_module.DEFAULT_KEEP_MAX_MB > 0
    service = create_app(FakePredictor(), settings).state.service
    assert service.capture.max_bytes == int(capture_module.DEFAULT_KEEP_MAX_MB * 2**20)
    unlimited = ServeSettings(keep=("all",), keep_dir=str(tmp_path / "kept"), keep_max_mb=0)
    assert create_app(FakePredictor(), unlimited).state.service.capture.max_bytes is None
    capture = Capture(tmp_path / "small", max_bytes=3000)
    with caplog.at_level(logging.WARNING, logger="defectdet.serve.capture"):
        for _ in range(6):
            assert capture.write(_item(1000)) is not None
    warnings = [record.getMessage() for record in caplog.records if "cap" in record.getMessage()]
    assert capture.counts["evicted"] >= 3 and len(warnings) == 1, warnings  # once a minute, not per item
    assert "deleted 1 unreviewed item" in warnings[0] and "--keep-max-mb" in warnings[0]


def test_serve_warns_at_start_when_keep_has_no_cap(
    bundle_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from defectdet.cli import app
    from defectdet.serve import launch

    monkeypatch.setattr(launch, "run_uvicorn", lambda config: None)
    keep = ["serve", str(bundle_path), "--keep", "flagged", "--keep-dir", str(tmp_path / "k")]
    capped = CliRunner().invoke(app, keep)
    assert capped.exit_code == 0 and "no disk cap" not in capped.output, capped.output
    unlimited = CliRunner().invoke(app, [*keep, "--keep-max-mb", "0"])
    assert unlimited.exit_code == 0 and "no disk cap" in unlimited.output, unlimited.output


def test_one_keep_folder_many_writers_one_cap_unique_names(tmp_path: Path) -> None:
    import threading

    writers = [Capture(tmp_path, max_bytes=8000) for _ in range(3)]  # as three processes on one folder
    names: list[str | None] = []

    def keep(capture: Capture) -> None:
        for _ in range(10):
            names.append(capture.write(_item(900, template=True)))

    threads = [threading.Thread(target=keep, args=(capture,)) for capture in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert None not in names and len(set(names)) == 30  # every item kept (evicting others'), no name twice
    assert all(f"-{os.getpid()}-" in name for name in names)
    files = _kept_files(tmp_path)
    assert sum(path.stat().st_size for path in files) <= 8000
    assert not [path for path in files if path.name.endswith(".tmp")]
    for sidecar in (tmp_path / "predictions").iterdir():  # every item left is whole
        body = json.loads(sidecar.read_text())
        assert (tmp_path / body["image"]).is_file() and (tmp_path / body["template"]).is_file()


def test_decisions_made_by_another_process_are_seen_and_kept_in_reviewed_txt(tmp_path: Path) -> None:
    from defectdet.serve.review import ReviewFolder

    for index in range(3):
        Capture(tmp_path).write(
            KeptItem(encode(board(index)), None, {"time": 1.0 + index, "reasons": ["all"]})
        )
    first, second = (ReviewFolder(tmp_path, ["open", "short"], operator=who) for who in ("ann", "bob"))
    one, two, _ = (item["name"] for item in first.listing()["items"])
    first.decide(one, "clean")
    assert {item["name"]: item["status"] for item in second.listing()["items"]}[one] == "clean"
    second.decide(two, "accept", [{"class_id": 1, "box": [10, 10, 40, 40]}])
    reviewed = (tmp_path / "reviewed.txt").read_text().split()
    assert reviewed == [f"./images/{one}", f"./images/{two}"]  # bob's write kept ann's decision
    assert {item["name"]: item["status"] for item in first.listing()["items"]}[two] == "accept"


# ------------------------------------------------------------------ eviction and review decisions
def _kept_boards(folder: Path, count: int) -> tuple[Capture, list[str]]:
    """`count` kept boards, oldest first, and a cap that one more board only fits under by evicting one."""
    capture = Capture(folder)
    names = [
        capture.write(KeptItem(encode(board(1)), None, {"time": 1_700_000_000.0 + i, "reasons": ["all"]}))
        for i in range(count)
    ]
    capture.max_bytes = capture.bytes + 100
    return capture, names


def _next_board() -> KeptItem:
    return KeptItem(encode(board(1)), None, {"time": 1_700_000_100.0, "reasons": ["all"]})


def test_the_cap_waits_for_a_decision_being_written_and_never_orphans_its_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from defectdet.serve.review import ReviewFolder

    capture, (name,) = _kept_boards(tmp_path, 1)
    folder = ReviewFolder(tmp_path, ["open", "short"], operator="ann")
    image = next(item["name"] for item in folder.listing()["items"])
    writing = threading.Event()
    check_version = folder._check_version

    def slow_check(*args: object) -> None:  # the decision is under way: label file and log next
        writing.set()
        time.sleep(0.5)
        check_version(*args)

    monkeypatch.setattr(folder, "_check_version", slow_check)
    decided: list[dict] = []
    thread = threading.Thread(
        target=lambda: decided.append(
            folder.decide(image, "accept", [{"class_id": 1, "box": [5, 5, 30, 30]}])
        )
    )
    thread.start()
    assert writing.wait(10)
    kept = capture.write(_next_board())  # the cap needs the image's room while its decision is written
    thread.join(10)
    assert decided and decided[0]["status"] == "accept"
    assert (tmp_path / "images" / image).is_file() and (tmp_path / "labels" / f"{name}.txt").is_file()
    assert (tmp_path / "reviewed.txt").read_text().split() == [f"./images/{image}"]
    assert kept is None and capture.counts["dropped:cap"] == 1  # only a labelled item was left to delete


def test_a_decision_on_an_image_the_cap_just_deleted_is_a_404_and_writes_no_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from defectdet.serve import review as review_module
    from defectdet.serve.review import ReviewFolder
    from defectdet.serve.upload import UploadError

    capture, (name,) = _kept_boards(tmp_path, 1)
    folder = ReviewFolder(tmp_path, ["open", "short"], operator="ann")
    image = next(item["name"] for item in folder.listing()["items"])
    arrived, evicted = threading.Event(), threading.Event()
    real_lock = review_module.folder_lock

    def lock_after_eviction(path: Path):  # the decision reaches its lock only once the cap has run
        arrived.set()
        assert evicted.wait(10)
        return real_lock(path)

    monkeypatch.setattr(review_module, "folder_lock", lock_after_eviction)
    errors: list[UploadError] = []

    def decide() -> None:
        try:
            folder.decide(image, "clean")
        except UploadError as error:
            errors.append(error)

    thread = threading.Thread(target=decide)
    thread.start()
    assert arrived.wait(10)
    assert capture.write(_next_board()) is not None and capture.counts["evicted"] == 1
    evicted.set()
    thread.join(10)
    assert errors and errors[0].status == 404 and "cap deleted it" in errors[0].reason
    assert not (tmp_path / "images" / image).exists() and not (tmp_path / "labels").exists()
    assert not (tmp_path / "decisions.jsonl").exists()


def test_the_cap_deletes_undecided_items_before_decided_ones(tmp_path: Path) -> None:
    from defectdet.serve.review import ReviewFolder

    capture, names = _kept_boards(tmp_path, 3)
    folder = ReviewFolder(tmp_path, ["open", "short"], operator="ann")
    oldest, second, newest = (item["name"] for item in folder.listing()["items"])
    folder.decide(oldest, "skip")  # decided, no label file
    assert capture.write(_next_board()) is not None and capture.counts["evicted"] == 1
    left = sorted(path.name for path in (tmp_path / "images").iterdir())
    assert oldest in left and second not in left and newest in left


# ------------------------------------------------------------------ the uploaded file name
def test_the_uploaded_file_name_is_kept_sanitised_and_listed_for_review(
    keep_client: TestClient, tmp_path: Path
) -> None:
    sent = {
        "C:\\line3\\part-0042.png": "part-0042.png",  # a whole Windows path: its last part
        "../../etc/part\x1b-7\u202e\u200b.png": "part-7.png",  # no path, no control or invisible characters
        "p" * 1000 + ".png": "p" * 156 + ".png",  # bounded, the end kept
    }
    for name in sent:
        response = keep_client.post("/v1/detect", files={"image": (name, encode(board(3)), "image/png")})
        assert response.status_code == 200 and response.json()["kept"] is True, response.text
    keep_client.app.state.service.capture.drain()
    sidecars = [json.loads(path.read_text()) for path in (tmp_path / "kept" / "predictions").iterdir()]
    assert sorted(sidecar["upload_name"] for sidecar in sidecars) == sorted(sent.values())
    items = keep_client.get("/v1/review/items").json()["items"]
    assert sorted(item["upload_name"] for item in items) == sorted(sent.values())
    assert all(
        item["captured"].endswith("Z") and item["name"].startswith(item["captured"][:4]) for item in items
    )


def test_the_review_listing_is_sorted_by_capture_time_then_uploaded_name(tmp_path: Path) -> None:
    from defectdet.serve.review import ReviewFolder

    uploads = {  # file name -> (capture time, uploaded name): the file names sort otherwise
        "a.png": (1_700_000_200.0, "part-3.png"),
        "b.png": (1_700_000_100.0, "part-9.png"),
        "c.png": (1_700_000_300.0, "part-2.png"),
        "d.png": (1_700_000_300.4, "part-1.png"),  # the same second as c.png: by the uploaded name
    }
    for sub in ("images", "predictions"):
        (tmp_path / sub).mkdir()
    for name, (when, uploaded) in uploads.items():
        (tmp_path / "images" / name).write_bytes(encode(board(1)))
        sidecar = {"time": when, "upload_name": uploaded, "reasons": ["all"]}
        (tmp_path / "predictions" / f"{Path(name).stem}.json").write_text(json.dumps(sidecar))
    (tmp_path / "images" / "e.png").write_bytes(encode(board(2)))  # no sidecar: no capture time, first
    items = ReviewFolder(tmp_path, ["open", "short"]).listing()["items"]
    assert [item["name"] for item in items] == ["e.png", "b.png", "a.png", "d.png", "c.png"]
    assert [item["captured"] for item in items[:2]] == [None, "2023-11-14T22:15:00Z"]
    assert items[0]["upload_name"] is None and items[1]["upload_name"] == "part-9.png"
