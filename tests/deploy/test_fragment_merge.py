"""Fragment merge: overlapping pieces of one large defect reported as one box, for the classes export chose."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from defectdet.data.formats import load_dataset
from defectdet.export import exporter
from defectdet.export.fragment_choice import MIN_BOXES, choose_merged, merge_candidates
from defectdet.postprocess import merge_fragments
from defectdet.runtime.bundle import BundleMetadata, read_metadata, write_metadata
from defectdet.runtime.predictor import Predictor
from defectdet.runtime.spec import ModelSpec


def test_pieces_of_one_defect_join_and_other_classes_and_far_boxes_stay() -> None:
    boxes = np.array(
        [
            [0, 0, 100, 20],  # class 0, the best piece of a long defect
            [40, 2, 200, 22],  # class 0: 60x18 px of the smaller (100x20) lie inside the first -> joins
            [300, 300, 320, 320],  # class 0, far away: stays
            [10, 0, 90, 20],  # class 1: never merged
            [150, 0, 250, 20],  # class 0, overlaps the grown box but scores under 0.3 of it: stays
        ],
        np.float32,
    )
    scores = np.array([0.9, 0.5, 0.8, 0.7, 0.2], np.float32)
    classes = np.array([0, 0, 0, 1, 0], np.int64)
    merged_boxes, merged_scores, merged_classes = merge_fragments(boxes, scores, classes, (0,))
    np.testing.assert_array_equal(merged_boxes[0], [0, 0, 200, 22])  # grown to cover both, kept its score
    assert merged_scores.tolist() == pytest.approx([0.9, 0.8, 0.7, 0.2])
    assert merged_classes.tolist() == [0, 0, 1, 0]
    # nothing to merge: everything as it was
    same = merge_fragments(boxes, scores, classes, ())
    np.testing.assert_array_equal(same[0], boxes)


def test_export_chooses_the_classes_where_merging_raised_ap(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rows = [
        {"class": "scratch", "gt": MIN_BOXES, "AP50": 0.40},
        {"class": "spot", "gt": 40, "AP50": 0.80},
        {"class": "crack", "gt": MIN_BOXES - 1, "AP50": 0.10},  # too few boxes to decide: not tried
    ]
    assert merge_candidates(rows) == ["scratch", "spot"]
    merged_rows = [dict(rows[0], AP50=0.52), dict(rows[1], AP50=0.78), rows[2]]
    chosen, evidence = choose_merged(rows, merged_rows, ["scratch", "spot"])
    assert chosen == ["scratch"]
    assert evidence["spot"] == {"as_is": 0.80, "merged": 0.78, "boxes": 40}

    # the exporter's flow: scored as is, with every candidate merged, then written with the chosen ones
    written: list[list[str]] = []
    metadata = BundleMetadata(
        defectdet_version="test", created="now", class_names=["scratch", "spot", "crack"], input_size=64,
        channels=1, template=False,
    )  # fmt: skip

    def fake_validate(bundle: Path, data: Path, **_: object) -> dict:
        merged = written[-1] if written else []
        return {
            "per_class": merged_rows if merged else rows,
            "headline": {"threshold": 0.3 if merged else 0.4},
        }

    monkeypatch.setattr("defectdet.engine.validate.validate", fake_validate)
    monkeypatch.setattr(
        exporter, "write_metadata", lambda path, meta: written.append(list(meta.thresholds.merge_fragments))
    )
    metrics, chosen_metadata = exporter._merge_fragments(tmp_path / "b.onnx", metadata, tmp_path, "val", 0.99)
    assert written == [["scratch", "spot"], ["scratch"]]
    assert chosen_metadata.thresholds.merge_fragments == ["scratch"]
    assert chosen_metadata.metrics["fragment_merge"]["scratch"] == {
        "as_is": 0.40,
        "merged": 0.52,
        "boxes": 10,
    }
    assert metrics["headline"]["threshold"] == 0.3  # scored with the merge the bundle will run
    # export --no-merge-fragments: scored once as is, nothing tried or written
    written.clear()
    metrics, unchosen = exporter._merge_fragments(tmp_path / "b.onnx", metadata, tmp_path, "val", 0.99, False)
    assert written == [] and unchosen.thresholds.merge_fragments == []
    assert metrics["headline"]["threshold"] == 0.4


def test_bundle_runs_its_merge_and_refuses_unknown_classes(bundle_path: Path, tmp_path: Path) -> None:
    metadata = read_metadata(bundle_path)
    with pytest.raises(ValueError, match="merge_fragments names classes the bundle does not have"):
        BundleMetadata.model_validate(
            {
                **metadata.model_dump(),
                "thresholds": {**metadata.thresholds.model_dump(), "merge_fragments": ["x"]},
            }
        )
    name = metadata.class_names[0]
    chosen = metadata.model_copy(
        update={"thresholds": metadata.thresholds.model_copy(update={"merge_fragments": [name]})}
    )
    spec = ModelSpec.from_bundle(chosen)
    assert spec.postprocess.merge_classes == (0,)
    assert spec.with_merge_fragments(False).postprocess.merge_classes == ()
    assert Predictor(bundle_path).spec.postprocess.merge_classes == ()  # exported without a merge


def test_predictor_reports_every_piece_inside_one_merged_box(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    metadata = read_metadata(bundle_path)
    merged_bundle = tmp_path / "merged.onnx"
    shutil.copy(bundle_path, merged_bundle)
    thresholds = metadata.thresholds.model_copy(update={"merge_fragments": list(metadata.class_names)})
    write_metadata(merged_bundle, metadata.model_copy(update={"thresholds": thresholds}))
    sample = load_dataset(tiny_dataset, "val").samples[0]
    plain = Predictor(bundle_path).predict(sample.image_path, sample.template_path, score_floor=0.001)
    merged = Predictor(merged_bundle).predict(sample.image_path, sample.template_path, score_floor=0.001)
    assert 0 < len(merged.detections) < len(plain.detections)  # a barely trained model answers in pieces
    assert {d.score for d in merged.detections} <= {d.score for d in plain.detections}
    for piece in plain.detections:
        assert any(
            whole.class_id == piece.class_id
            and whole.box[0] <= piece.box[0] + 0.01
            and whole.box[1] <= piece.box[1] + 0.01
            and whole.box[2] >= piece.box[2] - 0.01
            and whole.box[3] >= piece.box[3] - 0.01
            for whole in merged.detections
        )
