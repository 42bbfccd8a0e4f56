"""The review API (`defectdet review`, `serve --keep-dir`): decisions -> YOLO label files and the JSONL log, bad
input, the guards, and COCO export."""

from __future__ import annotations

import contextlib
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_fakes import FakePredictor, board, encode

from defectdet.data.formats import load_dataset
from defectdet.serve.review import ReviewFolder
from defectdet.serve.review_app import create_review_app
from defectdet.serve.server import create_app
from defectdet.serve.settings import ServeSettings
from defectdet.serve.upload import UploadError

CLASSES = ["open", "short", "mousebite"]
POST_HEADERS = {"X-Defectdet-Request": "1"}
BAD_LABEL = "0 0.5 0.5 0.2 0.2\n1 0.5 oops 0.2 0.2\n"


def make_folder(root: Path) -> Path:
    """images/a.png (200x100, a sidecar with one predicted box), b.png (a hand-edited label file with a bad
    line 2), c.png (truncated: a valid header, no pixels), d.png (no labels), notes.png (not an image)."""
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    (root / "predictions").mkdir()
    wide = board(1, size=200)[:100]
    (root / "images" / "a.png").write_bytes(encode(wide))
    (root / "images" / "b.png").write_bytes(encode(board(2, size=120)))
    (root / "images" / "c.png").write_bytes(encode(board(3, size=120))[:60])
    (root / "images" / "d.png").write_bytes(encode(board(4, size=80, blob=False)))
    (root / "images" / "notes.png").write_bytes(b"these are my notes, not an image")
    (root / "labels" / "b.txt").write_text(BAD_LABEL)
    sidecar = {
        "reasons": ["flagged"],
        "verdict": "defective",
        "class_names": CLASSES,
        "detections": [{"class_id": 1, "class_name": "short", "score": 0.9, "box": [50, 40, 90, 70]}],
    }
    (root / "predictions" / "a.json").write_text(json.dumps(sidecar))
    return root


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "kept")


@pytest.fixture
def client(folder: Path) -> Iterator[TestClient]:
    app = create_review_app(ReviewFolder(folder, operator=""), ServeSettings())
    with TestClient(app, base_url="http://localhost") as client:
        yield client


def _decide(client: TestClient, image: str, action: str, boxes: list | None = None, **extra: object):
    payload = {"image": image, "action": action, "boxes": boxes or [], "operator": "anna", **extra}
    return client.post("/v1/review/decide", json=payload, headers=POST_HEADERS)


def _log(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "decisions.jsonl").read_text().splitlines()]


def test_the_listing_shows_predictions_label_errors_and_broken_images(client: TestClient) -> None:
    body = client.get("/v1/review/items").json()
    assert body["class_names"] == CLASSES  # from the kept sidecars
    items = {item["name"]: item for item in body["items"]}
    assert [item["name"] for item in body["items"]] == ["a.png", "b.png", "c.png", "d.png", "notes.png"]
    assert items["a.png"]["boxes"] == [
        {"class_id": 1, "class_name": "short", "box": [50, 40, 90, 70], "score": 0.9}
    ]
    assert items["a.png"]["status"] == "pending" and items["a.png"]["reasons"] == ["flagged"]
    assert items["b.png"]["label_error"].startswith("labels/b.txt line 2: expected 'class cx cy w h'")
    assert "not an accepted image format" in items["notes.png"]["error"]
    assert body["counts"]["broken"] == 1 and body["counts"]["label_errors"] == 1
    # the truncated PNG passes the header check; showing it fails, and from then on it is listed broken
    refused = client.get("/v1/review/image/c.png")
    assert refused.status_code == 422 and "c.png" in refused.json()["error"]
    assert client.get("/v1/review/items").json()["counts"]["broken"] == 2
    shown = client.get("/v1/review/image/a.png")
    assert shown.status_code == 200 and shown.headers["content-type"] == "image/png"


def test_accept_writes_the_boxes_as_yolo_labels_and_logs_who_and_when(
    client: TestClient, folder: Path
) -> None:
    response = _decide(client, "a.png", "accept", [{"class_id": 1, "box": [50, 40, 90, 70]}])
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "accept"
    assert (folder / "labels" / "a.txt").read_text() == "1 0.350000 0.550000 0.200000 0.300000\n"
    (entry,) = _log(folder)
    assert entry["operator"] == "anna" and entry["action"] == "accept" and entry["image"] == "images/a.png"
    assert entry["labels"] == "labels/a.txt" and entry["time"].endswith("Z")
    assert (folder / "reviewed.txt").read_text() == "./images/a.png\n"
    assert not list(folder.rglob("*.tmp"))


def test_reclass_delete_and_draw_are_saved_at_once(client: TestClient, folder: Path) -> None:
    label = folder / "labels" / "a.txt"
    _decide(client, "a.png", "edit", [{"class_id": 2, "box": [50, 40, 90, 70]}])  # re-classed
    assert label.read_text() == "2 0.350000 0.550000 0.200000 0.300000\n"
    drawn = [{"class_id": 2, "box": [50, 40, 90, 70]}, {"class_id": 0, "box": [0, 0, 20, 10]}]
    _decide(client, "a.png", "edit", drawn)  # a box drawn
    assert label.read_text().splitlines()[1] == "0 0.050000 0.050000 0.100000 0.100000"
    _decide(client, "a.png", "edit", drawn[1:])  # the first deleted
    assert label.read_text() == "0 0.050000 0.050000 0.100000 0.100000\n"
    # a box past the edge is clipped to the image
    _decide(client, "a.png", "edit", [{"class_id": 0, "box": [190, 90, 260, 130]}])
    assert label.read_text() == "0 0.975000 0.950000 0.050000 0.100000\n"
    assert [entry["action"] for entry in _log(folder)] == ["edit"] * 4


def test_clean_writes_an_empty_label_file_and_skip_drops_the_image(client: TestClient, folder: Path) -> None:
    assert _decide(client, "d.png", "clean").status_code == 200
    assert (folder / "labels" / "d.txt").read_text() == ""
    assert _decide(client, "a.png", "skip").json()["status"] == "skip"
    assert not (folder / "labels" / "a.txt").exists()
    assert (folder / "reviewed.txt").read_text() == "./images/d.png\n"
    assert _decide(client, "notes.png", "skip").status_code == 200  # a broken image can be skipped
    refused = _decide(client, "notes.png", "accept")
    assert refused.status_code == 422 and "notes.png" in refused.json()["error"]
    # a reload reads the log back
    again = ReviewFolder(folder)
    assert again.decisions["a.png"].action == "skip" and again.decisions["d.png"].operator == "anna"


def test_the_reviewed_images_become_a_dataset_train_can_read(client: TestClient, folder: Path) -> None:
    from defectdet.data.formats import load_dataset

    (folder / "templates").mkdir()
    (folder / "templates" / "a.jpg").write_bytes(encode(board(1, size=200)[:100], ".jpg"))  # another format
    _decide(client, "a.png", "accept", [{"class_id": 2, "box": [50, 40, 90, 70]}])
    _decide(client, "d.png", "clean")
    split, val = load_dataset(folder / "data.yaml", "train"), load_dataset(folder / "data.yaml", "val")
    # the newest images (by name: capture time) are held out for validation, not trained on
    assert [sample.image_path.name for sample in split.samples] == ["a.png"]
    assert [sample.image_path.name for sample in val.samples] == ["d.png"]
    assert split.class_names == CLASSES
    assert split.samples[0].classes.tolist() == [2] and len(val.samples[0].classes) == 0
    assert split.samples[0].template_path == folder / "templates" / "a.jpg"
    # a data.yaml of the user's own is never overwritten
    (folder / "data.yaml").write_text("path: .\ntrain: images\nval: images\nnames: [x]\n")
    _decide(client, "a.png", "accept", [{"class_id": 0, "box": [0, 0, 20, 10]}])
    assert (folder / "data.yaml").read_text().startswith("path: .\ntrain: images")


def test_a_bad_label_file_is_not_rewritten_until_the_operator_decides(
    client: TestClient, folder: Path
) -> None:
    label = folder / "labels" / "b.txt"
    client.get("/v1/review/items")
    client.post("/v1/review/export", json={}, headers=POST_HEADERS)
    _decide(client, "a.png", "accept", [{"class_id": 0, "box": [1, 1, 9, 9]}])
    assert label.read_text() == BAD_LABEL
    _decide(client, "b.png", "accept", [{"class_id": 0, "box": [0, 0, 60, 60]}])
    assert label.read_text() == "0 0.250000 0.250000 0.500000 0.500000\n"


@pytest.mark.parametrize(
    ("payload", "status", "words"),
    [
        (
            {"image": "a.png", "action": "accept", "boxes": [{"class_id": 7, "box": [0, 0, 5, 5]}]},
            422,
            "class_id",
        ),
        (
            {"image": "a.png", "action": "accept", "boxes": [{"class_id": 0, "box": [0, 0, 5]}]},
            422,
            "4 finite",
        ),
        ({"image": "a.png", "action": "burn"}, 422, "action must be one of"),
        ({"image": "../decisions.jsonl", "action": "skip"}, 404, "no image"),
        ({"image": "zz.png", "action": "skip"}, 404, "no image"),
        ({"image": "a" * 10_000 + ".png", "action": "skip"}, 404, "no image"),  # too long for the OS
        ({"action": "skip"}, 422, "image"),
    ],
)
def test_bad_decisions_get_a_4xx_with_the_reason(
    client: TestClient, folder: Path, payload: dict, status: int, words: str
) -> None:
    response = client.post("/v1/review/decide", json={"operator": "anna", **payload}, headers=POST_HEADERS)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]
    assert not (folder / "decisions.jsonl").exists() and not (folder / "labels" / "a.txt").exists()


def test_an_empty_box_is_dropped_with_a_note_and_the_other_boxes_are_saved(
    client: TestClient, folder: Path
) -> None:
    boxes = [
        {"class_id": 0, "box": [10, 10, 60, 50]},
        {"class_id": 1, "box": [5, 5, 5, 9]},  # zero width
        {"class_id": 2, "box": [20, 30, 40, 30.4]},  # under a pixel high
    ]
    response = _decide(client, "a.png", "edit", boxes)
    assert response.status_code == 200, response.text
    assert response.json()["dropped"] == [
        "boxes[1]: dropped, the box is empty inside the 200x100 image",
        "boxes[2]: dropped, the box is empty inside the 200x100 image",
    ]
    assert (folder / "labels" / "a.txt").read_text() == "0 0.175000 0.300000 0.250000 0.400000\n"
    assert len(_log(folder)[-1]["dropped"]) == 2


def test_an_empty_proposal_is_never_served(client: TestClient, folder: Path) -> None:
    sidecar = json.loads((folder / "predictions" / "a.json").read_text())
    sidecar["threshold"] = 0.5
    sidecar["detections"] += [
        {"class_id": 0, "score": 0.4, "box": [10, 20, 10, 40]},
        {"class_id": 0, "score": 0.3, "box": [10, 20, 30, 20]},
    ]
    (folder / "predictions" / "a.json").write_text(json.dumps(sidecar))
    item = next(i for i in client.get("/v1/review/items").json()["items"] if i["name"] == "a.png")
    assert [box["box"] for box in item["predictions"]] == [[50, 40, 90, 70]]
    assert item["threshold"] == 0.5 and item["has_labels"] is False


def test_the_download_is_the_reviewed_dataset_as_a_zip(
    client: TestClient, folder: Path, tmp_path: Path
) -> None:
    _decide(client, "a.png", "accept", [{"class_id": 0, "box": [10, 10, 60, 50]}])
    _decide(client, "d.png", "skip")
    response = client.get("/v1/review/download")
    assert response.status_code == 200, response.text
    assert response.headers["content-disposition"] == 'attachment; filename="kept-labels.zip"'
    (tmp_path / "labels.zip").write_bytes(response.content)
    with zipfile.ZipFile(tmp_path / "labels.zip") as archive:
        names = set(archive.namelist())
        assert archive.read("labels/a.txt") == (folder / "labels" / "a.txt").read_bytes()
        left_out = archive.read("left_out.txt").decode().splitlines()
    # b.png's label file has a bad line and d.png was skipped: left out, as from the COCO export
    assert names == {
        "data.yaml", "reviewed.txt", "reviewed_train.txt", "reviewed_val.txt", "decisions.jsonl", "images/a.png",
        "labels/a.txt", "left_out.txt",
    }  # fmt: skip
    assert left_out[0].startswith("images/b.png: left out: its label file does not read (labels/b.txt line 2")
    assert left_out[1:] == [
        "images/c.png: left out: not reviewed",
        "images/d.png: left out: skipped by anna",
        "images/notes.png: left out: not reviewed",
    ]


def test_an_edit_never_accepted_does_not_train_and_the_download_says_why(
    client: TestClient, folder: Path, tmp_path: Path
) -> None:
    """a.png has one box drawn (an edit, never accepted): its other defects are not boxed yet, so it must not
    train as if they were background. Only the accepted and the clean images go into the lists, the zip and the
    COCO export; the zip's left_out.txt names the edit and why."""
    _decide(client, "a.png", "edit", [{"class_id": 0, "box": [10, 10, 60, 50]}])
    _decide(client, "d.png", "clean")
    assert (folder / "labels" / "a.txt").is_file()  # the edit is saved, it just does not train
    assert (folder / "reviewed.txt").read_text() == "./images/d.png\n"
    lists = (folder / "reviewed_train.txt").read_text() + (folder / "reviewed_val.txt").read_text()
    assert "a.png" not in lists
    (tmp_path / "labels.zip").write_bytes(client.get("/v1/review/download").content)
    with zipfile.ZipFile(tmp_path / "labels.zip") as archive:
        names = set(archive.namelist())
        left_out = archive.read("left_out.txt").decode()
    assert "images/d.png" in names and "labels/d.txt" in names
    assert "images/a.png" not in names and "labels/a.txt" not in names
    assert "images/a.png: left out: boxes drawn but never accepted" in left_out
    coco = client.post("/v1/review/export", json={}, headers=POST_HEADERS).json()
    assert coco["images"] == 1 and any(
        p.startswith("images/a.png: left out: boxes drawn") for p in coco["problems"]
    )
    _decide(client, "a.png", "accept", [{"class_id": 0, "box": [10, 10, 60, 50]}])  # accepted: it trains
    assert "./images/a.png" in (folder / "reviewed.txt").read_text().splitlines()


def _version(client: TestClient, image: str) -> int:
    return next(i for i in client.get("/v1/review/items").json()["items"] if i["name"] == image)["version"]


def test_a_save_from_a_stale_version_is_refused_with_409_and_writes_nothing(
    client: TestClient, folder: Path
) -> None:
    """Two clients read a.png at version 0; the first accept wins, the second (still on version 0) gets 409
    and neither its labels nor its log line are written."""
    read = _version(client, "a.png")
    assert read == 0
    first = _decide(client, "a.png", "accept", [{"class_id": 1, "box": [50, 40, 90, 70]}], version=read)
    assert first.status_code == 200 and first.json()["version"] == 1
    saved = (folder / "labels" / "a.txt").read_text()
    second = _decide(client, "a.png", "edit", [{"class_id": 0, "box": [0, 0, 20, 10]}], version=read)
    assert second.status_code == 409, second.text
    assert second.json()["status"] == 409
    error = second.json()["error"]
    assert "a.png" in error and "version 0" in error and "version 1" in error and "accept by anna" in error
    assert (folder / "labels" / "a.txt").read_text() == saved
    assert [entry["action"] for entry in _log(folder)] == ["accept"]
    assert _version(client, "a.png") == 1 and ReviewFolder(folder).versions["a.png"] == 1  # read from the log
    again = _decide(client, "a.png", "edit", [{"class_id": 0, "box": [0, 0, 20, 10]}], version=1)
    assert again.status_code == 200 and again.json()["version"] == 2  # decided again on what is saved
    bad = _decide(client, "a.png", "clean", version="1")
    assert bad.status_code == 422 and "version" in bad.json()["error"]


def test_a_stale_version_is_refused_across_processes(folder: Path) -> None:
    """Another process (a serve replica) saved a decision on the image: this one's version is stale."""
    here, there = ReviewFolder(folder), ReviewFolder(folder)
    assert here.item(here.image_path("d.png"))["version"] == 0
    there.decide("d.png", "clean", operator="bob", version=0)
    with pytest.raises(UploadError) as refused:
        here.decide("d.png", "accept", [{"class_id": 0, "box": [1, 1, 9, 9]}], "anna", version=0)
    assert refused.value.status == 409 and "clean by bob" in refused.value.reason
    assert (folder / "labels" / "d.txt").read_text() == ""


@pytest.mark.parametrize("length", [300, 10_000])
def test_names_too_long_for_the_file_system_are_a_404_naming_no_path(client: TestClient, length: int) -> None:
    name = "b" * length + ".png"
    for route in (
        f"/v1/review/image/{name}",
        f"/v1/review/template/{name}",
        f"/v1/review/companion/L2/{name}",
    ):
        response = client.get(route)
        assert response.status_code == 404, (route[:40], response.status_code)
        assert "no image" in response.json()["error"] and "/" not in response.json()["error"]


def test_a_decision_needs_an_operator(client: TestClient) -> None:
    response = _decide(client, "a.png", "clean", operator=" ")
    assert response.status_code == 422 and "operator" in response.json()["error"]


def test_state_changes_need_the_header_json_and_the_same_origin(client: TestClient, folder: Path) -> None:
    payload = {"image": "a.png", "action": "clean", "operator": "anna"}
    assert client.post("/v1/review/decide", json=payload).status_code == 403  # no X-Defectdet-Request
    form = client.post("/v1/review/decide", data=payload, headers=POST_HEADERS)  # what an HTML form sends
    assert form.status_code == 415
    evil = {**POST_HEADERS, "Origin": "http://evil.example"}
    assert client.post("/v1/review/decide", json=payload, headers=evil).status_code == 403
    site = {**POST_HEADERS, "Sec-Fetch-Site": "cross-site"}
    assert client.post("/v1/review/decide", json=payload, headers=site).status_code == 403
    rebound = client.post("/v1/review/decide", json=payload, headers={**POST_HEADERS, "Host": "evil.example"})
    assert rebound.status_code == 400
    assert not (folder / "labels" / "a.txt").exists()


def test_with_a_token_every_route_but_the_page_needs_it(folder: Path) -> None:
    app = create_review_app(folder, ServeSettings(token="s3cret"))
    with TestClient(app, base_url="http://localhost") as client:
        page = client.get("/review")
        assert page.status_code == 200 and "default-src 'none'" in page.headers["content-security-policy"]
        assert client.get("/static/review.js").status_code == 200
        assert client.get("/v1/review/items").status_code == 401
        assert client.get("/v1/review/image/a.png").status_code == 401
        assert _decide(client, "a.png", "clean").status_code == 401
        auth = {"Authorization": "Bearer s3cret"}
        assert client.get("/v1/review/items", headers=auth).status_code == 200
        ok = client.post(
            "/v1/review/decide",
            json={"image": "a.png", "action": "clean", "operator": "x"},
            headers={**auth, **POST_HEADERS},
        )
        assert ok.status_code == 200


def test_export_coco_reads_back_as_a_coco_dataset(client: TestClient, folder: Path) -> None:
    _decide(
        client,
        "a.png",
        "accept",
        [{"class_id": 1, "box": [50, 40, 90, 70]}, {"class_id": 2, "box": [0, 0, 20, 10]}],
    )
    _decide(client, "d.png", "clean")
    _decide(client, "notes.png", "skip")
    response = client.post("/v1/review/export", json={}, headers=POST_HEADERS)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["images"] == 2 and body["annotations"] == 2 and body["path"] == "annotations.coco.json"
    assert any("labels/b.txt line 2" in problem for problem in body["problems"])
    split = load_dataset(folder / "annotations.coco.json", format="coco")
    samples = {sample.image_path.name: sample for sample in split.samples}
    assert set(samples) == {"a.png", "d.png"} and split.class_names == CLASSES
    assert samples["d.png"].boxes.shape[0] == 0
    boxes = sorted(samples["a.png"].boxes.tolist())
    assert boxes == [[0, 0, 20, 10], [50, 40, 90, 70]]
    assert sorted(samples["a.png"].classes.tolist()) == [1, 2]


def test_serve_with_keep_dir_reviews_what_it_kept(tmp_path: Path) -> None:
    settings = ServeSettings(keep=("flagged",), keep_dir=str(tmp_path / "kept"))
    app = create_app(FakePredictor(), settings)
    with TestClient(app, base_url="http://localhost") as client:
        assert app.state.service.ready.wait(30)
        assert client.post("/v1/detect", files={"image": encode(board(5))}).json()["kept"] is True
        app.state.service.capture.drain()
        (item,) = client.get("/v1/review/items").json()["items"]
        assert item["boxes"][0]["box"] == [50, 40, 90, 70] and item["reasons"] == ["flagged"]
        response = _decide(client, item["name"], "accept", [{"class_id": 1, "box": [50, 40, 90, 70]}])
        assert response.status_code == 200, response.text
        stem = item["name"].rsplit(".", 1)[0]
        assert (
            tmp_path / "kept" / "labels" / f"{stem}.txt"
        ).read_text() == "1 0.437500 0.343750 0.250000 0.187500\n"
        assert "default-src 'none'" in client.get("/").headers["content-security-policy"]
        assert 'route="/v1/review"' in client.get("/metrics").text


def test_review_cli_exports_coco(folder: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from defectdet.cli import app

    ReviewFolder(folder).decide("a.png", "accept", [{"class_id": 0, "box": [10, 10, 30, 30]}], "anna")
    out = tmp_path / "out" / "labels.json"
    result = CliRunner().invoke(app, ["review", str(folder), "--export-coco", str(out)])
    assert result.exit_code == 0, result.output
    assert "1 images, 1 boxes" in result.output and "labels/b.txt line 2" in result.output
    document = json.loads(out.read_text())
    assert document["images"][0]["file_name"] == "../kept/images/a.png"
    assert document["annotations"][0]["bbox"] == [10, 10, 20, 20]


def test_review_export_coco_onto_a_folder_is_one_clear_line(folder: Path, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    (tmp_path / "exports").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "defectdet.cli", "review", str(folder), "--export-coco", str(tmp_path / "exports")],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in said, said
    assert "exports: a folder; the COCO export is one json file" in said
    assert list((tmp_path / "exports").iterdir()) == []


def test_operator_names_lose_control_and_bidi_characters_before_the_log(
    client: TestClient, folder: Path
) -> None:
    """U+202E (right-to-left override) would show a log line reversed, ESC would colour a terminal: both go;
    letters of any script stay."""
    response = _decide(client, "a.png", "clean", operator="\u202eanna\x1b[2J\u200b Žofie\t王")
    assert response.status_code == 200, response.text
    (entry,) = _log(folder)
    assert entry["operator"] == "anna[2J Žofie 王"
    only_controls = _decide(client, "b.png", "clean", operator="\u202e\x1b\u200f")
    assert only_controls.status_code == 422 and "operator" in only_controls.json()["error"]


def _item(client: TestClient, image: str) -> dict:
    return next(i for i in client.get("/v1/review/items").json()["items"] if i["name"] == image)


def test_a_stray_accept_is_undone_with_its_labels_and_status_and_stays_undone_after_a_reload(
    client: TestClient, folder: Path
) -> None:
    """a.png: a box drawn (an edit), then a stray accept of 300 boxes. Undo restores the edit's label file and
    status, and takes a.png out of reviewed.txt; a second undo takes back the edit (no label file, unreviewed,
    the model's proposal shown again). A fresh ReviewFolder (a reload, another replica) reads the same; with
    nothing left, undo is a 409."""
    label = folder / "labels" / "a.txt"
    drawn = _decide(client, "a.png", "edit", [{"class_id": 0, "box": [10, 10, 60, 50]}], version=0).json()
    edited = label.read_bytes()
    stray = [{"class_id": 1, "box": [x, 20, x + 5, 30]} for x in range(0, 180, 6)] * 10
    accepted = _decide(client, "a.png", "accept", stray, version=drawn["version"]).json()
    assert accepted["status"] == "accept" and accepted["undoable"] == "accept"
    assert len(label.read_text().splitlines()) == 300 and "a.png" in (folder / "reviewed.txt").read_text()
    undone = _decide(client, "a.png", "undo", version=accepted["version"])
    assert undone.status_code == 200, undone.text
    assert undone.json()["status"] == "edit" and undone.json()["undoable"] == "edit"
    assert label.read_bytes() == edited and "a.png" not in (folder / "reviewed.txt").read_text()
    again = ReviewFolder(folder).item(folder / "images" / "a.png")  # what a reload reads from the log
    assert again["status"] == "edit" and again["version"] == 3 and again["undoable"] == "edit"
    assert [box["box"] for box in again["boxes"]] == [[10, 10, 60, 50]]
    stale = _decide(client, "a.png", "undo", version=accepted["version"])
    assert stale.status_code == 409 and label.read_bytes() == edited  # the version check holds for undo too
    first = _decide(client, "a.png", "undo", version=3).json()
    assert first["status"] == "pending" and first["undoable"] is None and not label.exists()
    assert first["boxes"] == first["predictions"] != []  # unreviewed: the model's proposal is shown again
    nothing = _decide(client, "a.png", "undo", version=4)
    assert nothing.status_code == 409 and "nothing to undo" in nothing.json()["error"]
    log = _log(folder)
    assert [entry["action"] for entry in log] == ["edit", "accept", "undo", "undo"]
    assert log[2]["undid"] == {"action": "accept", "operator": "anna", "time": log[1]["time"]}


def test_reset_brings_an_image_back_to_unreviewed_and_undo_restores_its_file_byte_for_byte(
    client: TestClient, folder: Path
) -> None:
    """b.png has a hand-made label file with a bad line (and a byte that is not UTF-8): reset removes it, the
    image is unreviewed again; undo puts the very bytes back."""
    label = folder / "labels" / "b.txt"
    label.write_bytes(BAD_LABEL.encode() + b"# \xff\n")
    original = label.read_bytes()
    reset = _decide(client, "b.png", "reset", version=0)
    assert reset.status_code == 200, reset.text
    assert reset.json()["status"] == "pending" and reset.json()["undoable"] == "reset" and not label.exists()
    assert reset.json()["label_error"] is None and reset.json()["has_labels"] is False
    undone = _decide(client, "b.png", "undo", version=1).json()
    assert label.read_bytes() == original and undone["status"] == "pending"  # no decision, as before
    assert undone["label_error"].startswith("labels/b.txt line 2")
    accepted = _decide(client, "a.png", "accept", [{"class_id": 0, "box": [1, 1, 9, 9]}]).json()
    assert accepted["boxes"] != accepted["predictions"]
    assert _decide(client, "a.png", "reset").json()["boxes"] == accepted["predictions"]  # proposals again
    assert not (folder / "labels" / "a.txt").exists() and (folder / "reviewed.txt").read_text() == ""
    assert _decide(client, "notes.png", "reset").status_code == 200  # a broken image can be reset too


def test_cleared_proposals_stay_cleared_after_a_reload_until_undone_or_reset(
    client: TestClient, folder: Path
) -> None:
    cleared = _decide(client, "a.png", "edit", [], version=0, proposals_cleared=True).json()
    assert cleared["proposals_cleared"] is True and cleared["boxes"] == [] and cleared["has_labels"] is True
    assert (folder / "labels" / "a.txt").read_text() == ""
    reopened = ReviewFolder(folder).item(folder / "images" / "a.png")  # the page opened again
    assert reopened["proposals_cleared"] is True
    drawn = _decide(client, "a.png", "edit", [{"class_id": 0, "box": [10, 10, 60, 50]}], version=1).json()
    assert drawn["proposals_cleared"] is True  # still cleared after the next box
    assert _decide(client, "a.png", "undo", version=2).json()["proposals_cleared"] is True
    back = _decide(client, "a.png", "undo", version=3).json()  # the clear taken back
    assert back["proposals_cleared"] is False and back["status"] == "pending"
    assert not (folder / "labels" / "a.txt").exists()
    _decide(client, "a.png", "edit", [], proposals_cleared=True)
    assert _decide(client, "a.png", "reset").json()["proposals_cleared"] is False
    bad = _decide(client, "a.png", "reset", proposals_cleared=True)
    assert bad.status_code == 422 and "proposals_cleared" in bad.json()["error"]
    assert _decide(client, "a.png", "edit", proposals_cleared="yes").status_code == 422


def test_a_decision_logged_without_the_labels_before_it_is_not_undone_blindly(
    client: TestClient, folder: Path
) -> None:
    line = {"time": "2026-01-01T00:00:00Z", "operator": "old", "image": "images/d.png", "action": "clean"}
    (folder / "decisions.jsonl").write_text(json.dumps(line) + "\n")
    (folder / "labels" / "d.txt").write_text("")
    assert _item(client, "d.png")["undoable"] is None
    refused = _decide(client, "d.png", "undo", version=1)
    assert refused.status_code == 409 and "cannot be undone" in refused.json()["error"]
    assert (folder / "labels" / "d.txt").read_text() == "" and len(_log(folder)) == 1


def test_a_decision_waiting_for_the_folder_lock_does_not_stall_the_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holds the review folder's lock: a decision waits for it in a worker thread while
    /healthz and the review listing answer; once the lock is released the decision is saved."""
    import socket
    import threading
    import time

    import httpx
    import uvicorn

    from defectdet.serve import review
    from defectdet.serve.capture import folder_lock

    kept = make_folder(tmp_path / "kept")
    waiting = threading.Event()

    @contextlib.contextmanager
    def observed_lock(path: Path) -> Iterator[None]:
        waiting.set()  # the decision is about to wait for the lock
        with folder_lock(path):
            yield

    monkeypatch.setattr(review, "folder_lock", observed_lock)
    app = create_app(FakePredictor(), ServeSettings(keep=("flagged",), keep_dir=str(kept)))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    url = f"http://127.0.0.1:{port}"
    answers: list[httpx.Response] = []
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "the service did not start"
            time.sleep(0.02)
        payload = {"image": "d.png", "action": "clean", "operator": "anna", "version": 0}
        decide = threading.Thread(
            target=lambda: answers.append(
                httpx.post(url + "/v1/review/decide", json=payload, headers=POST_HEADERS, timeout=60)
            )
        )
        with folder_lock(kept / review.REVIEW_LOCK):  # another process deciding
            decide.start()
            assert waiting.wait(20), "the decision never reached the lock"
            health = httpx.get(url + "/healthz", timeout=10)
            listing = httpx.get(url + "/v1/review/items", timeout=10)
            assert decide.is_alive() and not answers  # still waiting for the lock
        assert health.status_code == 200 and listing.status_code == 200
        assert next(i for i in listing.json()["items"] if i["name"] == "d.png")["status"] == "pending"
        decide.join(30)
        assert answers and answers[0].status_code == 200, answers
        assert answers[0].json()["status"] == "clean" and (kept / "labels" / "d.txt").read_text() == ""
    finally:
        server.should_exit = True
        serving.join(10)
