"""Shadow, promotion and roll-back in `serve --models-dir` (serve.deployment, serve.model_routes), on real
bundles: the fixture's bundle with its verdict threshold rewritten, so that two bundles disagree on purpose."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_fakes import CLASS_NAMES, FakePredictor, board, encode

from defectdet.runtime.bundle import read_metadata, write_metadata
from defectdet.runtime.predictor import Detection, PredictionResult
from defectdet.serve import store
from defectdet.serve.deployment import Deployment, ServedModel, disagreement, file_sha256
from defectdet.serve.metrics import ServiceMetrics
from defectdet.serve.server import create_app
from defectdet.serve.settings import ServeSettings
from defectdet.serve.upload import UploadError

POST = {"X-Defectdet-Request": "1"}


def variant(bundle: Path, out: Path, threshold: float, **changes: object) -> Path:
    """A copy of `bundle` whose verdict threshold (and other metadata) differ: 1.0 calls every image clean,
    0.0 every image with any detection defective."""
    shutil.copyfile(bundle, out)
    meta = read_metadata(out)
    thresholds = meta.thresholds.model_copy(update={"threshold": threshold})
    write_metadata(out, meta.model_copy(update={"thresholds": thresholds, **changes}))
    return out


@pytest.fixture
def line(bundle_path: Path, tmp_path: Path) -> dict[str, Path]:
    """The served file (never clean -> 'clean' always), a models folder with a candidate that calls every
    image defective, and one of another input layout."""
    models, line_dir = tmp_path / "models", tmp_path / "line"
    models.mkdir()
    line_dir.mkdir()
    served = variant(bundle_path, line_dir / "model.onnx", 1.0)
    candidate = variant(bundle_path, models / "candidate.onnx", 0.0)
    variant(bundle_path, models / "other-layout.onnx", 0.5, template=not read_metadata(bundle_path).template)
    names = read_metadata(bundle_path).class_names
    variant(bundle_path, models / "other-line.onnx", 0.5, class_names=[f"{name}-x" for name in names])
    return {"served": served, "models": models, "candidate": candidate}


def _client(served: Path, models: Path | None, **settings: object) -> TestClient:
    app = create_app(served, ServeSettings(models_dir=str(models) if models else None, **settings))
    return TestClient(app, base_url="http://localhost")


def _detect(client: TestClient, seed: int) -> dict:
    image = encode(board(seed, size=160))
    template = encode(board(seed, size=160, blob=False))
    files = {"image": ("a.png", image)}
    if client.app.state.service.metadata.template:
        files["template"] = ("t.png", template)
    answer = client.post("/v1/detect", files=files)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _ready(client: TestClient) -> None:
    for _ in range(400):
        if client.get("/readyz").status_code == 200:
            return
        time.sleep(0.05)
    raise AssertionError("the service did not get ready")


def test_disagreement_compares_verdicts_and_boxes_by_class_name() -> None:
    def result(*detections: Detection, threshold: float = 0.5) -> PredictionResult:
        verdict = "defective" if any(d.score >= threshold for d in detections) else "clean"
        return PredictionResult(list(detections), verdict, threshold, (100, 100), {})

    short = Detection((10, 10, 30, 30), 1, "short", 0.9)
    assert disagreement(result(short), result(Detection((11, 11, 31, 31), 4, "short", 0.7))) == []
    assert disagreement(result(short), result()) == ["verdict", "boxes"]
    assert disagreement(result(short), result(Detection((10, 10, 30, 30), 1, "open", 0.9))) == ["boxes"]
    assert disagreement(result(short), result(short, Detection((60, 60, 80, 80), 1, "short", 0.8))) == [
        "boxes"
    ]
    # a detection under its own model's threshold does not count
    assert disagreement(result(short), result(short, Detection((60, 60, 80, 80), 1, "short", 0.2))) == []


def test_shadow_reports_its_disagreement_rate_in_models_and_metrics(line: dict[str, Path]) -> None:
    with _client(line["served"], line["models"]) as client:
        _ready(client)
        started = client.post("/v1/models/shadow", json={"bundle": "candidate.onnx"}, headers=POST)
        assert started.status_code == 200, started.text
        live_version = started.json()["live"]["model_version"]
        answers = [_detect(client, seed) for seed in range(4)]
        assert {answer["model_version"] for answer in answers} == {live_version}  # the shadow never answers
        assert {answer["verdict"] for answer in answers} == {"clean"}
        assert client.app.state.service.deployment.shadow.wait()
        report = client.get("/v1/models").json()
        shadow = report["shadow"]
        assert shadow["name"] == "candidate.onnx" and shadow["threshold"] == 0.0
        assert shadow["images"] == 4
        assert shadow["disagreement_rate"] == 1.0  # the candidate calls every image defective
        assert shadow["disagreements"]["verdict"] == 4
        assert shadow["recent_disagreements"][0]["live"]["verdict"] == "clean"
        assert [c["name"] for c in report["candidates"]] == [
            "candidate.onnx",
            "other-layout.onnx",
            "other-line.onnx",
        ]
        metrics = client.get("/metrics").text
        assert "defectdet_shadow_disagreement_rate 1.0" in metrics
        assert 'defectdet_shadow_disagreements_total{kind="verdict"} 4.0' in metrics
        assert f'defectdet_model{{role="live",version="{live_version}"}} 1.0' in metrics
        stopped = client.post("/v1/models/shadow", json={"bundle": None}, headers=POST)
        assert stopped.json()["shadow"] is None
        assert 'role="shadow"' not in client.get("/metrics").text


def test_promote_makes_the_shadow_live_and_rollback_restores_it(line: dict[str, Path]) -> None:
    served, models = line["served"], line["models"]
    original = served.read_bytes()
    with _client(served, models) as client:
        _ready(client)
        before = _detect(client, 0)["model_version"]
        client.post("/v1/models/shadow", json={"bundle": "candidate.onnx"}, headers=POST)
        _detect(client, 1)
        client.app.state.service.deployment.shadow.wait()
        promoted = client.post("/v1/models/promote", json={"by": "anna", "force": True}, headers=POST)
        assert promoted.status_code == 200, promoted.text
        body = promoted.json()
        assert body["live"]["name"] == "candidate.onnx" and body["shadow"] is None
        assert body["done"]["shadow"]["images"] == 1  # the evidence the promotion was made on
        assert body["done"]["generation"] == 2 and body["live"]["generation"] == 2
        assert body["done"]["forced"] is True and body["done"]["compare"] is None
        after = _detect(client, 2)
        assert (
            after["model_version"] != before and after["model_version"] == file_sha256(line["candidate"])[:12]
        )
        assert served.read_bytes() == original  # the store records the change; the given file is untouched
        assert (models / body["previous"]["file"]).read_bytes() == original
        again = client.post(
            "/v1/models/promote", json={"bundle": "candidate.onnx", "force": True}, headers=POST
        )
        assert again.status_code == 409 and "already the live model" in again.json()["error"]
        back = client.post("/v1/models/rollback", json={"by": "anna"}, headers=POST)
        assert back.status_code == 200, back.text
        assert back.json()["done"]["generation"] == 3
        assert _detect(client, 3)["model_version"] == before
    history = [json.loads(line_) for line_ in (models / "promotions.jsonl").read_text().splitlines()]
    assert [(h["action"], h["by"]) for h in history] == [
        ("shadow", "anonymous"),  # no name, no token: said so, never null
        ("promote", "anna"),
        ("rollback", "anna"),
    ]


def test_a_restart_serves_the_promoted_bundle_and_can_still_roll_back(line: dict[str, Path]) -> None:
    served, models = line["served"], line["models"]
    original = file_sha256(served)
    with _client(served, models) as client:
        _ready(client)
        body = {"bundle": "candidate.onnx", "force": True}
        assert client.post("/v1/models/promote", json=body, headers=POST).status_code == 200
    with _client(served, models) as client:  # the same command line, after a restart
        _ready(client)
        report = client.get("/v1/models").json()
        assert report["live"]["sha256"] == file_sha256(line["candidate"])
        assert report["store"]["generation"] == report["live"]["generation"] == 2
        assert report["previous"]["file"].startswith("store/bundles/")
        assert client.post("/v1/models/rollback", json={}, headers=POST).status_code == 200
        assert client.get("/v1/models").json()["live"]["sha256"] == original


def test_promote_installs_the_bytes_that_ran_in_shadow(line: dict[str, Path], bundle_path: Path) -> None:
    """The candidate file replaced while its model runs in shadow: promoting the shadow installs the bytes
    that were compared, never the file's new bytes, and the old model can still be rolled back to."""
    served, models, candidate = line["served"], line["models"], line["candidate"]
    shadowed = file_sha256(candidate)
    with _client(served, models) as client:
        _ready(client)
        live = client.get("/v1/models").json()["live"]["sha256"]
        assert (
            client.post("/v1/models/shadow", json={"bundle": "candidate.onnx"}, headers=POST).status_code
            == 200
        )
        variant(bundle_path, candidate, 0.5)  # never vetted
        assert file_sha256(candidate) != shadowed
        promoted = client.post("/v1/models/promote", json={"force": True}, headers=POST)
        assert promoted.status_code == 200, promoted.text
        report = promoted.json()
        assert report["live"]["sha256"] == shadowed and report["store"]["live"]["sha256"] == shadowed
        assert file_sha256(models / report["store"]["live"]["file"]) == shadowed
        assert report["previous"]["sha256"] == live
    with _client(served, models) as client:  # a restart serves the vetted bytes too
        _ready(client)
        assert client.get("/v1/models").json()["live"]["sha256"] == shadowed
        assert client.post("/v1/models/rollback", json={}, headers=POST).status_code == 200
        assert client.get("/v1/models").json()["live"]["sha256"] == live


def test_two_rollbacks_go_back_two_models_and_the_store_keeps_a_capped_history(
    line: dict[str, Path], bundle_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "RECENT_S", 0.0)  # copies are removed as soon as no generation needs them
    served, models = line["served"], line["models"]
    shas = {"A": file_sha256(served)}
    for name, threshold in (("B", 0.2), ("C", 0.3), ("D", 0.4)):
        shas[name] = file_sha256(variant(bundle_path, models / f"{name}.onnx", threshold))
    with _client(served, models, models_keep=2) as client:
        _ready(client)
        for name in "BCD":
            body = {"bundle": f"{name}.onnx", "force": True}
            assert client.post("/v1/models/promote", json=body, headers=POST).status_code == 200
        report = client.get("/v1/models").json()
        assert [item["sha256"] for item in report["rollback_history"]] == [shas["C"], shas["B"]]
        kept = {path.name for path in (models / "store" / "bundles").iterdir()}
        assert kept == {f"{name}-{shas[name][:12]}.onnx" for name in "BCD"}  # A fell off the history
        for expected in "CB":
            back = client.post("/v1/models/rollback", json={}, headers=POST)
            assert back.status_code == 200, back.text
            assert back.json()["live"]["sha256"] == shas[expected]
            assert _detect(client, 0)["model_version"] == shas[expected][:12]
        last = client.post("/v1/models/rollback", json={}, headers=POST)
        assert last.status_code == 409 and "nothing to roll back to" in last.json()["error"]
    with pytest.raises(ValueError, match="models_keep must be >= 1"):
        ServeSettings(models_keep=0)


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        ({"bundle": "../model.onnx"}, 422, "a file name in the models folder"),
        ({"bundle": "/etc/passwd"}, 422, "a file name in the models folder"),
        (
            {"bundle": "missing.onnx"},
            404,
            "there: broken.onnx, candidate.onnx, other-layout.onnx, other-line.onnx",
        ),
        ({"bundle": "other-layout.onnx"}, 422, "other-layout.onnx: bundle metadata field 'template'"),
        ({"bundle": "broken.onnx"}, 422, "broken.onnx: onnxruntime cannot load it"),
        ({"bundle": "other-line.onnx"}, 409, "a new model may add classes, not drop them"),
        ({"bundle": "model.onnx", "extra": 1}, 422, "extra"),
    ],
)
def test_bad_candidates_are_refused_with_a_reason_and_the_live_model_stays(
    line: dict[str, Path], body: dict, status: int, reason: str
) -> None:
    (line["models"] / "broken.onnx").write_bytes(b"not an onnx file")
    with _client(line["served"], line["models"]) as client:
        _ready(client)
        live = client.get("/v1/models").json()["live"]["sha256"]
        for route in ("/v1/models/shadow", "/v1/models/promote"):
            answer = client.post(route, json=body, headers=POST)
            assert answer.status_code == status, answer.text
            assert reason in answer.json()["error"]
            assert str(line["models"]) not in answer.json()["error"]  # no server path in an answer
        assert client.get("/v1/models").json()["live"]["sha256"] == live
        assert _detect(client, 0)["model_version"] == live[:12]
    assert not (line["models"] / "promotions.jsonl").exists()


def test_a_candidate_for_another_input_layout_is_refused(tmp_path: Path) -> None:
    (tmp_path / "with-template.onnx").write_bytes(b"stands for a bundle")
    metrics = ServiceMetrics(CLASS_NAMES, None)
    deployment = Deployment(
        ServedModel.of(FakePredictor(template=False)),
        metrics,
        models_dir=tmp_path,
        load=lambda path: FakePredictor(template=True),
    )
    with pytest.raises(
        UploadError, match="takes gray images with a template, the live model gray images without"
    ):
        deployment.start_shadow("with-template.onnx")
    assert deployment.shadow is None


def test_model_changes_need_the_token_the_request_header_and_a_models_folder(line: dict[str, Path]) -> None:
    with _client(line["served"], line["models"], token="s3cret") as client:
        _ready(client)
        body = {"bundle": "candidate.onnx"}
        assert client.post("/v1/models/promote", json=body, headers=POST).status_code == 401
        auth = {"Authorization": "Bearer s3cret"}
        assert (
            client.post("/v1/models/promote", json=body, headers=auth).status_code == 403
        )  # no request mark
        form = client.post("/v1/models/promote", data=body, headers={**auth, **POST})
        assert form.status_code == 415  # a cross-site form cannot send JSON
        cross = client.post(
            "/v1/models/promote", json=body, headers={**auth, **POST, "Origin": "http://evil"}
        )
        assert cross.status_code == 403
        assert client.get("/v1/models", headers=auth).json()["live"]["name"] == "model.onnx"
    with _client(line["served"], None) as client:
        _ready(client)
        answer = client.post("/v1/models/promote", json=body, headers=POST)
        assert answer.status_code == 409 and "--models-dir" in answer.json()["error"]
        assert client.post("/v1/models/rollback", json={}, headers=POST).status_code == 409
    with pytest.raises(ValueError, match="--shadow needs --models-dir"):
        ServeSettings(shadow="candidate.onnx")


def test_serve_can_start_with_a_shadow(line: dict[str, Path]) -> None:
    with _client(line["served"], line["models"], shadow="candidate.onnx") as client:
        _ready(client)
        assert client.get("/v1/models").json()["shadow"]["name"] == "candidate.onnx"
    with pytest.raises(Exception, match="no bundle 'nope.onnx'"):
        _client(line["served"], line["models"], shadow="nope.onnx")
    with _client(line["served"], line["models"], shadow="candidate.onnx") as client:
        body = {"force": True}
        assert client.post("/v1/models/promote", json=body, headers=POST).status_code == 200
    # restarted with the same command line after its shadow was promoted: it serves it, with no shadow
    with _client(line["served"], line["models"], shadow="candidate.onnx") as client:
        report = client.get("/v1/models").json()
        assert report["live"]["name"] == "candidate.onnx" and report["shadow"] is None


def test_a_shadow_that_fails_on_an_image_is_counted_not_raised(line: dict[str, Path]) -> None:
    with _client(line["served"], line["models"], shadow="candidate.onnx") as client:
        _ready(client)
        deployment = client.app.state.service.deployment

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("the candidate crashed")

        deployment.shadow.model.predictor.predict = broken
        assert _detect(client, 0)["verdict"] == "clean"
        assert deployment.shadow.wait()
        assert client.get("/v1/models").json()["shadow"]["errors"] == 1
        assert "defectdet_shadow_errors_total 1.0" in client.get("/metrics").text


def test_promote_needs_a_compare_verdict_of_promote_or_force(
    line: dict[str, Path], tiny_dataset: Path
) -> None:
    """The gate reads `defectdet compare`'s compare.json in the models folder, matched by the pair's sha256."""
    from defectdet.export.compare import KEEP, PROMOTE, compare_models

    served, models = line["served"], line["models"]
    body = {"bundle": "candidate.onnx"}
    with _client(served, models) as client:
        _ready(client)
        missing = client.post("/v1/models/promote", json=body, headers=POST)
        assert missing.status_code == 409 and "no compare verdict" in missing.json()["error"]
        assert "force: true" in missing.json()["error"]
        document = compare_models(served, line["candidate"], tiny_dataset, out=models / "compare")
        assert document["models"]["new"]["sha256"] == file_sha256(line["candidate"])
        assert document["verdict"]["decision"] == KEEP  # no clean image: false calls cannot be measured
        assert client.post("/v1/models/shadow", json=body, headers=POST).status_code == 200
        assert (
            client.get("/v1/models").json()["shadow"]["compare"]["decision"] == KEEP
        )  # shown before promoting
        kept = client.post("/v1/models/promote", json=body, headers=POST)
        assert kept.status_code == 409 and "compare said keep (compare/compare.json" in kept.json()["error"]
        assert client.get("/v1/models").json()["live"]["name"] == "model.onnx"
        # a verdict edited by hand to promote does not follow from its figures: still refused, saying so
        saved = json.loads((models / "compare" / "compare.json").read_text())
        saved["verdict"]["decision"] = PROMOTE
        (models / "compare" / "compare.json").write_text(json.dumps(saved))
        edited = client.post("/v1/models/promote", json=body, headers=POST)
        assert edited.status_code == 409, edited.text
        assert (
            "the recorded verdict 'promote' does not follow from the recorded figures"
            in edited.json()["error"]
        )
        assert client.get("/v1/models").json()["live"]["name"] == "model.onnx"
        forced = client.post("/v1/models/promote", json={**body, "force": True}, headers=POST)
        assert forced.status_code == 200, forced.text
        done = forced.json()["done"]
        assert done["compare"]["decision"] == KEEP and done["compare"]["recorded_decision"] == PROMOTE
        assert done["forced"] is True
        back = client.post("/v1/models/rollback", json={"force": True}, headers=POST)
        assert back.status_code == 422  # a roll-back needs no override


def test_a_second_process_follows_the_store_and_refuses_bytes_that_do_not_hash_right(
    line: dict[str, Path], bundle_path: Path
) -> None:
    served, models = line["served"], line["models"]
    with _client(served, models) as first, _client(served, models) as second:
        _ready(first)
        _ready(second)
        follower = second.app.state.service.deployment
        follower._stop.set()  # this test calls follow() itself: the background poll must not race it
        if follower._watcher is not None:
            follower._watcher.join(timeout=10)
        body = {"bundle": "candidate.onnx", "force": True}
        assert first.post("/v1/models/promote", json=body, headers=POST).status_code == 200
        assert follower.follow() is True
        report = second.get("/v1/models").json()
        assert (
            report["live"]["sha256"] == file_sha256(line["candidate"]) and report["live"]["generation"] == 2
        )
        assert "defectdet_model_generation 2.0" in second.get("/metrics").text
        assert f'defectdet_model_serving{{generation="2",sha256="{report["live"]["sha256"]}"}} 1.0' in (
            second.get("/metrics").text
        )
        other = variant(bundle_path, models / "other.onnx", 0.5)
        assert (
            first.post(
                "/v1/models/promote", json={"bundle": "other.onnx", "force": True}, headers=POST
            ).status_code
            == 200
        )
        stored = models / first.get("/v1/models").json()["store"]["live"]["file"]
        stored.write_bytes(stored.read_bytes() + b"tampered")
        assert follower.follow() is False  # not loaded: its bytes are not the generation's
        assert second.get("/v1/models").json()["live"]["generation"] == 2
        stale = second.post("/v1/models/rollback", json={}, headers=POST)
        assert stale.status_code == 409 and "generation 3 is live" in stale.json()["error"]
        assert file_sha256(other) != report["live"]["sha256"]


def test_serve_refuses_to_start_on_a_generation_whose_bytes_do_not_hash_right(line: dict[str, Path]) -> None:
    served, models = line["served"], line["models"]
    with _client(served, models) as client:
        _ready(client)
        body = {"bundle": "candidate.onnx", "force": True}
        stored = client.post("/v1/models/promote", json=body, headers=POST).json()["store"]["live"]["file"]
    (models / stored).write_bytes((models / stored).read_bytes()[:-8])
    with pytest.raises(store.StoreError, match=r"generation 2 \(candidate.onnx\) cannot be served: .* hash"):
        create_app(served, ServeSettings(models_dir=str(models)))
