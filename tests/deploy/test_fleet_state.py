"""The models store as replicas share it (serve.store, serve.deployment), with fast stand-in models: a
generation that failed to load once is tried again and /readyz says not-ready meanwhile; torn or hand-edited
records are recovered from history or refused naming the file and the field, and a promotion never commits
and then fails; a `promote {}` reaching a replica without the shadow says where the shadow runs; every change
in promotions.jsonl says who, when, from where and whether it was forced. Plain files stand for bundles."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_fakes import CLASS_NAMES, FakePredictor

from defectdet.serve import deployment as deployment_module
from defectdet.serve.deployment import Deployment, ServedModel
from defectdet.serve.metrics import ServiceMetrics
from defectdet.serve.server import create_app
from defectdet.serve.settings import ServeSettings
from defectdet.serve.store import ModelStore, StoreError
from defectdet.serve.upload import UploadError

POST = {"X-Defectdet-Request": "1"}


def _models(folder: Path, *names: str) -> Path:
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_bytes(f"stands for the bundle {name}".encode())
    return folder


def _client(models: Path, **settings: object) -> TestClient:
    """The app on a stand-in live model; bundles of the models folder load as stand-ins too. No lifespan:
    the store poll does not run, the tests call follow() themselves."""
    app = create_app(FakePredictor(), ServeSettings(models_dir=str(models), **settings))
    app.state.service.deployment.load = lambda path: FakePredictor()
    return TestClient(app, base_url="http://localhost")


def _deployment(models: Path, **options: object) -> Deployment:
    return Deployment(
        ServedModel.of(FakePredictor()),
        ServiceMetrics(CLASS_NAMES, None),
        models_dir=models,
        load=lambda path: FakePredictor(),
        **options,
    )


def _ready(client: TestClient) -> dict:
    for _ in range(200):
        answer = client.get("/readyz")
        if answer.status_code == 200:
            return answer.json()
        time.sleep(0.02)
    raise AssertionError(f"not ready: {answer.text}")


def _log(models: Path) -> list[dict]:
    return [json.loads(row) for row in (models / "promotions.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- a generation that failed to load once


def test_a_generation_that_failed_to_load_once_is_tried_again_and_readyz_says_so_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deployment_module, "RETRY_FIRST_S", 0.3, raising=False)
    models = _models(tmp_path / "models", "A.onnx", "B.onnx")
    client = _client(models)
    replica = client.app.state.service.deployment
    store = ModelStore(models / "store")
    store.commit(0, "start", store.stage(models / "A.onnx"))
    assert replica.follow() is True and replica.generation == 1
    assert _ready(client)["ready"] is True
    entry = store.stage(models / "B.onnx")
    store.commit(1, "promote", entry, by="anna")
    copy = store.path(entry)
    whole = copy.read_bytes()
    copy.write_bytes(whole[:5])  # briefly truncated (a copy still arriving on a shared volume)
    assert replica.follow() is False and replica.generation == 1
    answer = client.get("/readyz")
    assert answer.status_code == 503, answer.text
    reason = answer.json()["reason"]
    assert "serving store generation 1, the store's current one is 2" in reason and "failed to load" in reason
    assert "defectdet_model_behind_store 1.0" in client.get("/metrics").text
    copy.write_bytes(whole)  # the file is whole again
    assert replica.follow() is False  # backing off: not tried again at once
    time.sleep(0.35)
    assert replica.follow() is True and replica.generation == 2  # tried again: never marked failed for good
    assert client.get("/v1/models").json()["live"]["sha256"] == entry.sha256
    assert _ready(client)["ready"] is True
    assert "defectdet_model_behind_store 0.0" in client.get("/metrics").text


def test_a_replica_behind_the_store_for_too_long_is_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deployment_module, "BEHIND_GRACE_S", 0.0, raising=False)
    models = _models(tmp_path / "models", "A.onnx", "B.onnx")
    client = _client(models)
    replica = client.app.state.service.deployment
    store = ModelStore(models / "store")
    store.commit(0, "start", store.stage(models / "A.onnx"))
    assert replica.follow() is True and _ready(client)
    store.commit(1, "promote", store.stage(models / "B.onnx"))
    with replica._changing:  # a change of this process holds the lock: the poll cannot load it yet
        assert replica.follow() is False
        time.sleep(0.01)
        answer = client.get("/readyz")
    assert answer.status_code == 503 and "the store's current one is 2 since" in answer.json()["reason"]
    assert replica.follow() is True and _ready(client)


# ---------------------------------------------------------------- torn and hand-edited records


def test_a_torn_current_is_recovered_from_history_and_a_store_without_one_is_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    models = _models(tmp_path / "models", "A.onnx", "B.onnx", "C.onnx")
    store = ModelStore(models / "store")
    entries = {name: store.stage(models / f"{name}.onnx") for name in "ABC"}
    store.commit(0, "start", entries["A"])
    store.commit(1, "promote", entries["B"])
    current = store.root / "current"
    record = json.loads(current.read_text())
    current.write_text(json.dumps({key: value for key, value in record.items() if key != "stack"}))
    assert store.current() == record  # recovered from history/00000002.json
    for torn in ("[1]", '{"generation": 2', ""):
        current.write_text(torn)
        assert store.current() == record
    current.unlink()  # gone: still the newest generation, never a fresh start over it
    assert store.current() == record
    assert store.repair() == record and json.loads(current.read_text()) == record  # rewritten at start
    current.write_text(json.dumps({key: value for key, value in record.items() if key != "stack"}))
    assert store.commit(2, "promote", entries["C"])["stack"][0]["sha256"] == entries["B"].sha256
    lone = ModelStore(tmp_path / "other" / "store")
    (lone.root / "current").write_text(
        json.dumps({"generation": 1, "action": "start", "live": entries["A"].to_dict()})
    )
    with pytest.raises(StoreError, match=r"current: not a generation record: field 'stack' must be a list"):
        lone.current()
    (lone.root / "current").write_text(json.dumps({**record, "live": {"name": "A.onnx"}}))
    with pytest.raises(StoreError, match=r"current: .*field 'live.sha256'.*no generation in .*history"):
        _deployment(tmp_path / "other")  # serve refuses to start, naming the file and the field


def test_a_history_file_that_is_no_record_is_skipped_and_a_promotion_never_commits_then_fails(
    tmp_path: Path,
) -> None:
    models = _models(tmp_path / "models", "A.onnx", "B.onnx", "C.onnx")
    client = _client(models)
    replica = client.app.state.service.deployment
    store = replica.store
    store.commit(0, "start", store.stage(models / "A.onnx"))
    replica.follow()
    (store.generations / "00000007.json").write_text("[1]")  # hand-edited
    (store.generations / "00000008.json").write_text('{"generation": 8, "live": ')  # torn
    answer = client.post("/v1/models/promote", json={"bundle": "B.onnx", "force": True}, headers=POST)
    assert answer.status_code == 200, answer.text
    assert answer.json()["done"]["generation"] == 2
    models_report = client.get("/v1/models")
    assert models_report.status_code == 200
    assert [record["generation"] for record in models_report.json()["history"]] == [2, 1]

    def broken(model: ServedModel) -> None:
        raise RuntimeError("the page's class list could not be updated")

    replica.on_swap = broken  # fails after the generation is written
    answer = client.post("/v1/models/promote", json={"bundle": "C.onnx", "force": True}, headers=POST)
    assert answer.status_code == 200, answer.text
    assert answer.json()["done"]["generation"] == 3 and "did not switch yet" in answer.json()["warning"]
    assert store.current()["generation"] == 3


# ---------------------------------------------------------------- the shadow of another replica


def test_promote_of_the_shadow_on_a_replica_without_it_says_where_it_runs(tmp_path: Path) -> None:
    models = _models(tmp_path / "models", "candidate.onnx")
    first, second = _deployment(models), _deployment(models)
    with pytest.raises(UploadError) as nowhere:
        second.promote(None)
    assert nowhere.value.status == 409 and "nor in another one" in nowhere.value.reason
    first.start_shadow("candidate.onnx", by="anna")
    with pytest.raises(UploadError) as elsewhere:
        second.promote(None)
    reason = elsewhere.value.reason
    assert elsewhere.value.status == 409
    assert "a shadow is per process" in reason and "candidate.onnx" in reason
    assert f"in {socket.gethostname()}, pid {os.getpid()}" in reason
    assert second.live.sha256 == first.live.sha256  # nothing changed
    promoted = first.promote(None, by="anna", force=True)
    assert promoted["live"]["name"] == "candidate.onnx" and promoted["shadow"] is None
    with pytest.raises(UploadError, match="nor in another one"):  # the promoted shadow's note is gone
        second.promote(None)


# ---------------------------------------------------------------- the audit trail


def test_every_change_in_promotions_jsonl_says_who_when_from_where_and_forced(tmp_path: Path) -> None:
    models = _models(tmp_path / "models", "A.onnx", "B.onnx")
    client = _client(models, token="a-long-enough-token")
    replica = client.app.state.service.deployment
    replica.store.commit(0, "start", replica.store.stage(models / "A.onnx"))
    replica.follow()
    auth = {**POST, "Authorization": "Bearer a-long-enough-token"}
    steps = [
        ("/v1/models/shadow", {"bundle": "B.onnx"}),  # as the page sends it without a name: the token's
        ("/v1/models/shadow", {"bundle": None, "by": "olga\u202e\x1b[31m"}),
        ("/v1/models/promote", {"bundle": "B.onnx", "force": True, "by": "anna"}),
        ("/v1/models/rollback", {}),
    ]
    for route, body in steps:
        answer = client.post(route, json=body, headers=auth)
        assert answer.status_code == 200, answer.text
    log = _log(models)
    assert [(row["action"], row["by"]) for row in log] == [
        ("shadow", "token"),
        ("shadow-stop", "olga[31m"),  # control and bidi characters dropped
        ("promote", "anna"),
        ("rollback", "token"),
    ]
    for row in log:
        assert row["host"] == socket.gethostname() and row["pid"] == os.getpid()
        assert row["time"] and row["client"] == "testclient"
        assert row["forced"] is (row["action"] == "promote")


# ---------------------------------------------------------------- links in the models folder


def test_a_symbolic_link_in_the_models_folder_is_not_followed_into_the_store(tmp_path: Path) -> None:
    models = _models(tmp_path / "models", "candidate.onnx")
    secret = tmp_path / "elsewhere" / "secret.onnx"
    secret.parent.mkdir()
    secret.write_bytes(b"any file the service can read")
    (models / "link.onnx").symlink_to(secret)
    replica = _deployment(models)
    for change in (replica.start_shadow, replica.promote):
        with pytest.raises(UploadError, match="link.onnx is a symbolic link") as refused:
            change("link.onnx")
        assert refused.value.status == 422
    assert [item["name"] for item in replica.candidates()] == ["candidate.onnx"]
    assert not list((models / "store" / "bundles").glob("link*"))
