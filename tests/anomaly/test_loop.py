"""From a good-parts-only model to a detector: the anomaly map under the review page's boxes, real class names
for its boxes (classes.txt), `train --from` the anomaly bundle, and `compare` of the two, class-agnostic.

Fast: one bundle fitted in seconds at 96 px (the `good_only_bundle` fixture), no training step.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

SIZE = 96
DEFECT = (24, 24, 48, 44)  # x1, y1, x2, y2 of the bright rectangle painted on a good surface
POST = {"X-Defectdet-Request": "1"}


def _surface(index: int) -> np.ndarray:
    from defectdet.data.synth import generate_surface

    return generate_surface(7, index, SIZE, SIZE, materials=("cast",), clean=True).clean


def _defective(index: int) -> np.ndarray:
    image = _surface(index).copy()
    x1, y1, x2, y2 = DEFECT
    image[y1:y2, x1:x2] = 255
    return image


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A YOLO dataset of class "scratch": train and val, each 3 defective surfaces and 2 clean ones."""
    root = tmp_path_factory.mktemp("reviewed")
    x1, y1, x2, y2 = DEFECT
    line = f"0 {(x1 + x2) / 2 / SIZE} {(y1 + y2) / 2 / SIZE} {(x2 - x1) / SIZE} {(y2 - y1) / SIZE}\n"
    for split, first in (("train", 100), ("val", 200)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for index in range(first, first + 5):
            defective = index < first + 3
            cv2.imwrite(
                str(root / "images" / split / f"p{index}.png"),
                _defective(index) if defective else _surface(index),
            )
            (root / "labels" / split / f"p{index}.txt").write_text(line if defective else "")
    (root / "data.yaml").write_text(
        "path: .\ntrain: images/train\nval: images/val\nnames:\n  0: scratch\n", encoding="utf-8"
    )
    return root / "data.yaml"


@pytest.fixture(scope="module")
def detector_like(good_only_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The anomaly bundle's graph relabelled as a detector of one class, "scratch" (the same scores)."""
    from defectdet.runtime.bundle import read_metadata, write_metadata

    path = tmp_path_factory.mktemp("detector_like") / "detector.onnx"
    shutil.copyfile(good_only_bundle, path)
    meta = read_metadata(path)
    thresholds = meta.thresholds.model_copy(update={"merge_fragments": ["scratch"]})
    write_metadata(
        path,
        meta.model_copy(
            update={
                "class_names": ["scratch"],
                "thresholds": thresholds,
                "metrics": {"split": "val"},
                "train_config": {"preset": "lite0"},
            }
        ),
    )
    return path


def test_the_anomaly_map_marks_where_the_part_differs(good_only_bundle: Path) -> None:
    from defectdet.runtime.anomaly_map import anomaly_overlay_png, anomaly_scores
    from defectdet.runtime.predictor import Predictor

    scores = anomaly_scores(Predictor(good_only_bundle), _defective(50))
    assert scores.shape == (SIZE, SIZE)
    x1, y1, x2, y2 = DEFECT
    assert scores[y1 + 4 : y2 - 4, x1 + 4 : x2 - 4].min() >= 0.5  # the threshold, inside the defect
    # two corners far from the defect stay below the threshold (on this 96 px fixture the last column of cells,
    # whose features see the zero padding, scores higher: the top-right corner is not one of them)
    assert np.median(scores) < 0.5 and scores[:12, :12].max() < 0.5 and scores[80:, :12].max() < 0.5
    overlay = cv2.imdecode(np.frombuffer(anomaly_overlay_png(scores), np.uint8), cv2.IMREAD_UNCHANGED)
    assert overlay.shape == (SIZE, SIZE, 4)
    assert overlay[(y1 + y2) // 2, (x1 + x2) // 2, 3] > 100  # opaque on the defect
    assert np.median(overlay[..., 3]) < 40  # mostly see-through on the good surface


def test_the_review_page_gets_the_map_and_named_classes(good_only_bundle: Path, tmp_path: Path) -> None:
    """serve --keep-dir with a good-parts-only model: /v1/review/map offers the layer and draws it per image;
    classes.txt adds real class names after "anomaly", and a box accepted with one is saved with its id."""
    from defectdet.serve.server import create_app
    from defectdet.serve.settings import ServeSettings

    kept = tmp_path / "kept"
    (kept / "images").mkdir(parents=True)
    cv2.imwrite(str(kept / "images" / "part.png"), _defective(51))
    (kept / "classes.txt").write_text("scratch\nblob\n", encoding="utf-8")
    app = create_app(good_only_bundle, ServeSettings(keep_dir=str(kept)))
    with TestClient(app, base_url="http://localhost") as client:
        assert client.get("/v1/review/map").json() == {"available": True}
        answer = client.get("/v1/review/map/part.png")
        assert answer.status_code == 200 and answer.headers["content-type"] == "image/png"
        overlay = cv2.imdecode(np.frombuffer(answer.content, np.uint8), cv2.IMREAD_UNCHANGED)
        assert overlay.shape == (SIZE, SIZE, 4) and overlay[34, 36, 3] > overlay[5, 90, 3]
        missing = client.get("/v1/review/map/nothing.png")
        assert missing.status_code == 404 and "nothing.png" in missing.json()["error"]

        assert client.get("/v1/review/items").json()["class_names"] == ["anomaly", "scratch", "blob"]
        body = {"image": "part.png", "action": "accept", "operator": "olga",
                "boxes": [{"class_id": 2, "box": list(DEFECT)}]}  # fmt: skip
        decided = client.post("/v1/review/decide", json=body, headers=POST)
        assert decided.status_code == 200, decided.text
    assert (kept / "labels" / "part.txt").read_text().startswith("2 ")
    assert '2: "blob"' in (kept / "data.yaml").read_text()
    assert (kept / "classes.txt").read_text() == "anomaly\nscratch\nblob\n"  # the ids every reader sees


def test_reviewing_a_kept_folder_offline_keeps_the_model_classes_first(tmp_path: Path) -> None:
    """`defectdet review KEPT` on what a good-parts-only model kept, with classes.txt naming real classes: the
    sidecars' proposals keep their class ("anomaly", id 0) and the named classes follow it."""
    from defectdet.serve.review import ReviewFolder

    for sub in ("images", "predictions"):
        (tmp_path / sub).mkdir()
    cv2.imwrite(str(tmp_path / "images" / "part.png"), _defective(54))
    sidecar = {"class_names": ["anomaly"], "threshold": 0.5,
               "detections": [{"class_id": 0, "score": 0.9, "box": list(DEFECT)}]}  # fmt: skip
    (tmp_path / "predictions" / "part.json").write_text(json.dumps(sidecar))
    (tmp_path / "classes.txt").write_text("scratch\n")
    listing = ReviewFolder(tmp_path).listing()
    assert listing["class_names"] == ["anomaly", "scratch"]
    assert listing["items"][0]["predictions"][0]["class_name"] == "anomaly"


def test_an_image_that_cannot_be_drawn_is_a_clear_4xx(good_only_bundle: Path, tmp_path: Path) -> None:
    """An undecodable kept image is a 422 naming it; one the keep cap deletes while the map is asked for is a
    404, never a 500."""
    from defectdet.runtime.predictor import Predictor
    from defectdet.serve.review import ReviewFolder
    from defectdet.serve.review_map import AnomalyMaps
    from defectdet.serve.upload import UploadError

    class CapDeletes(ReviewFolder):
        def image_path(self, name: str) -> Path:
            path = super().image_path(name)
            path.unlink()  # the cap runs between the name check and the read
            return path

    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "torn.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    cv2.imwrite(str(tmp_path / "images" / "part.png"), _defective(53))
    predictor = Predictor(good_only_bundle)
    with pytest.raises(UploadError) as torn:
        AnomalyMaps(ReviewFolder(tmp_path, ["anomaly"]), lambda: predictor).overlay("torn.png")
    assert torn.value.status == 422 and "torn.png" in torn.value.reason
    with pytest.raises(UploadError) as gone:
        AnomalyMaps(CapDeletes(tmp_path, ["anomaly"]), lambda: predictor).overlay("part.png")
    assert gone.value.status == 404 and "part.png" in gone.value.reason


def test_offline_review_draws_the_map_with_the_model_given(
    good_only_bundle: Path, detector_like: Path, tmp_path: Path
) -> None:
    """`defectdet review KEPT --model BUNDLE`: the map of a good-parts-only bundle; without a model no map is
    offered (404, the page hides the layer); a detector as --model is refused, naming it."""
    from defectdet.errors import DefectDetError
    from defectdet.serve.review_app import create_review_app

    (tmp_path / "images").mkdir()
    cv2.imwrite(str(tmp_path / "images" / "part.png"), _defective(55))
    with TestClient(
        create_review_app(tmp_path, model=good_only_bundle), base_url="http://localhost"
    ) as client:
        assert client.get("/v1/review/map").json() == {"available": True}
        assert client.get("/v1/review/map/part.png").status_code == 200
    with TestClient(create_review_app(tmp_path), base_url="http://localhost") as client:
        assert client.get("/v1/review/map").status_code == 404
    with pytest.raises(DefectDetError, match="not a good-parts-only model"):
        create_review_app(tmp_path, model=detector_like)


def test_no_map_is_offered_for_a_detector(detector_like: Path, tmp_path: Path) -> None:
    from defectdet.serve.server import create_app
    from defectdet.serve.settings import ServeSettings

    (tmp_path / "images").mkdir()
    cv2.imwrite(str(tmp_path / "images" / "part.png"), _defective(52))
    app = create_app(detector_like, ServeSettings(keep_dir=str(tmp_path)))
    with TestClient(app, base_url="http://localhost") as client:
        assert client.get("/v1/review/map").json() == {"available": False}
        answer = client.get("/v1/review/map/part.png")
        assert answer.status_code == 404 and "not a good-parts-only model" in answer.json()["error"]


def test_train_from_a_good_only_bundle_starts_a_detector_from_the_standard_start(
    good_only_bundle: Path, labelled: Path, tmp_path: Path
) -> None:
    from defectdet.engine.config import DEFAULT_LEARNING_RATES, TrainConfig
    from defectdet.engine.trainer import build_train_data

    config = TrainConfig(data=labelled, start_from=good_only_bundle, out=tmp_path, device="cpu", workers=0)
    data = build_train_data(config)
    assert data.config.start_from is None and data.config.pretrained is not False
    assert data.config.lr == DEFAULT_LEARNING_RATES[data.config.optimizer]  # not a fine-tune's tenth
    assert data.class_names == ["scratch"]
    start = [choice for choice in data.choices if choice.name == "start"]
    assert len(start) == 1 and "good-parts-only model" in start[0].reason
    assert "standard start" in start[0].reason


def test_train_from_a_good_only_bundle_with_old_data_is_one_clear_error(
    good_only_bundle: Path, labelled: Path, tmp_path: Path
) -> None:
    from defectdet.cli import app
    from defectdet.errors import ConfigError

    done = CliRunner().invoke(
        app, ["train", str(labelled), "--from", str(good_only_bundle), "--old-data", str(labelled),
              "--out", str(tmp_path), "--epochs", "1"],
    )  # fmt: skip
    assert isinstance(done.exception, ConfigError), done.output  # `defectdet` exits 2 with its one line
    assert "good-parts-only" in str(done.exception) and "--clean-images" in str(done.exception)
    assert not (tmp_path / "last.pt").exists()


def test_compare_weighs_a_detector_against_the_anomaly_model_class_agnostic(
    good_only_bundle: Path, detector_like: Path, labelled: Path, tmp_path: Path
) -> None:
    """The anomaly model boxes "anomaly", the detector "scratch", the labels "scratch": every box counts as one
    class. The two graphs are the same, so every figure must be the same too."""
    from defectdet.cli import app

    out = tmp_path / "compare"
    done = CliRunner().invoke(
        app, ["compare", str(good_only_bundle), str(detector_like), str(labelled), "--out", str(out)]
    )
    assert done.exit_code in (0, 1), done.output
    assert "class-agnostic" in done.output
    document = json.loads((out / "compare.json").read_text())
    assert document["classes"]["class_agnostic"] is True and document["classes"]["evaluated"] == ["defect"]
    old, new = document["models"]["old"], document["models"]["new"]
    assert old["mAP50"] == new["mAP50"] and old["escapes"]["defects"] == 3
    assert old["escapes"] == new["escapes"] and old["false_calls"] == new["false_calls"]
    assert document["disagreements"] == []
