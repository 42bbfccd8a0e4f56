"""`defectdet compare OLD NEW DATA`: two tiny trained models (a bundle and a checkpoint exported on the fly) on the
same held-out split of a synthetic dataset, through the runtime, with recaptured clean boards."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.errors import InputError
from defectdet.export.compare import KEEP, PROMOTE, RULE, Tolerances, compare_models
from defectdet.export.compare_inputs import check_comparable
from defectdet.runtime.bundle import read_metadata, write_metadata
from defectdet.runtime.compare_rule import decide
from defectdet.runtime.model_quality import near_zero

runner = CliRunner()
PRED_RGB = np.array([255, 23, 68])  # evaluation.plots.PRED_COLOR


@pytest.fixture(scope="module")
def second_checkpoint(
    tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory, small_train_config
) -> Path:
    """Another tiny model: one epoch on the same data (a checkpoint, so compare exports it itself)."""
    from defectdet.engine.trainer import train

    config = small_train_config(
        tmp_path_factory.mktemp("compare_run"), data=tiny_dataset, input_size=192, crop_size=None, epochs=1,
        batch=2, warmup_steps=2, preset="nano", seed=1,
    )  # fmt: skip
    result = train(config)
    return Path(result.best_checkpoint or result.last_checkpoint)


def _expected(document: dict) -> str:
    """What the rule says on a comparison whose four comparisons all pass: promote, unless NEW's mAP@0.5 or
    recall is near zero (the tiny test model is close to that line)."""
    new = document["models"]["new"]
    missed = new["escapes"]["missed_defect_rate"]
    low = near_zero(new["mAP50"]) or (missed is not None and near_zero(1 - missed))
    return KEEP if low else PROMOTE


def _scores(map50: float, missed: float, escape: float, false_call: float = 0.0) -> dict:
    return {
        "mAP50": map50,
        "escapes": {"escape_rate": escape, "missed_defect_rate": missed},
        "false_calls": {"false_call_rate": false_call},
    }


def test_two_models_that_find_nothing_are_not_promoted() -> None:
    """mAP 0 and every defect missed on both sides: each comparison passes (equal is not worse), but NEW finds
    almost nothing, so the verdict keeps OLD and says why."""
    zero = _scores(0.0, 1.0, 1.0)
    verdict = decide(zero, dict(zero), Tolerances())
    assert all(check["passed"] for check in verdict["checks"][:4])
    assert verdict["decision"] == KEEP and verdict["exit_code"] == 1
    (reason,) = verdict["reasons"]
    assert reason.startswith(
        "NEW finds almost none of the labelled defects: mAP@0.5 0.0000 and recall 0.0000"
    )
    # a low recall alone is enough; a model that finds its defects is promoted
    blind = decide(_scores(0.3, 0.98, 0.9), _scores(0.3, 0.98, 0.9), Tolerances())
    assert blind["decision"] == KEEP and "recall 0.0200 near zero" in blind["reasons"][0]
    fine = decide(_scores(0.8, 0.1, 0.0), _scores(0.82, 0.1, 0.0), Tolerances())
    assert fine["decision"] == PROMOTE and fine["checks"][4]["passed"]


def _edited(bundle: Path, folder: Path, name: str, **changes) -> Path:
    """A copy of `bundle` with its metadata changed (`thresholds=` a dict of threshold fields, or fields)."""
    copy = folder / name
    shutil.copy(bundle, copy)
    meta = read_metadata(copy)
    if "thresholds" in changes:
        changes["thresholds"] = meta.thresholds.model_copy(update=changes["thresholds"])
    write_metadata(copy, meta.model_copy(update=changes))
    return copy


def test_a_model_against_itself_is_promoted_with_no_disagreement(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    result = runner.invoke(
        app, ["compare", str(bundle_path), str(bundle_path), str(tiny_dataset), "--clean-auto", "--out",
              str(tmp_path)],
    )  # fmt: skip
    document = json.loads((tmp_path / "compare.json").read_text())
    assert document["disagreements"] == [] and document["disagreements_png"] is None
    assert not (tmp_path / "disagreements.png").exists()
    verdict = document["verdict"]
    # against itself every comparison passes; the tiny model may still find too little to be promoted
    assert all(check["passed"] for check in verdict["checks"][:4]) and len(verdict["checks"]) == 5
    expected = _expected(document)
    assert verdict["decision"] == expected and verdict["rule"] == RULE
    assert result.exit_code == verdict["exit_code"] == (0 if expected == PROMOTE else 1), result.output
    assert f"verdict: {expected}" in result.output
    old, new = document["models"]["old"], document["models"]["new"]
    for key in ("mAP50", "mAP50_95", "escapes", "false_calls", "class_AP50", "threshold"):
        assert old[key] == new[key], key
    assert document["classes"]["matching"] == "identical class lists"
    assert old["false_calls"]["clean_boards"] == document["clean_boards"]["count"] > 0


def test_checkpoint_vs_bundle_reports_every_field_and_draws_the_disagreements(
    bundle_path: Path, second_checkpoint: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    document = compare_models(bundle_path, second_checkpoint, tiny_dataset, clean_auto=True, out=tmp_path)
    old, new = document["models"]["old"], document["models"]["new"]
    assert not old["exported_from_checkpoint"] and new["exported_from_checkpoint"]
    assert Path(new["bundle"]).is_file() and Path(new["bundle"]).suffix == ".onnx"
    split_images = document["split_images"]
    for model in (old, new):
        meta = read_metadata(model["bundle"])
        assert model["threshold"]["value"] == meta.thresholds.threshold
        assert meta.thresholds.threshold_source in model["threshold"]["source"]
        assert 0.0 <= model["mAP50"] <= 1.0 and 0.0 <= model["mAP50_95"] <= model["mAP50"]
        escapes = model["escapes"]
        assert escapes["defective_images"] == split_images  # every synthetic board has defects
        assert 0 <= escapes["escaped_images"] <= escapes["defective_images"]
        assert 0 <= escapes["missed_defects"] <= escapes["defects"] > 0
        calls = model["false_calls"]
        assert calls["clean_images"] == calls["split_clean_images"] + calls["clean_boards"]
        assert calls["false_call_rate"] == calls["false_calls"] / calls["clean_images"]
        assert set(model["class_AP50"]) <= set(document["classes"]["evaluated"]) and model["class_AP50"]
        latency = model["latency_ms"]
        assert latency["images"] == split_images + calls["clean_boards"]
        assert 0 < latency["p50"] <= latency["p95"]
    assert document["verdict"]["decision"] in ("promote", "keep OLD")
    assert len(document["verdict"]["reasons"]) >= 1
    # a barely trained model and a 3-epoch one do not draw the same boxes
    assert document["disagreements"], "the two models agree everywhere: the test data cannot tell them apart"
    for item in document["disagreements"]:
        assert item["reason"] and item["old"]["verdict"] in ("clean", "defective")
    grid = cv2.imread(document["disagreements_png"])
    rows = min(len(document["disagreements"]), 12)
    height, width = grid.shape[:2]
    assert 0.75 < (height / width) / (6.3 * rows / 11.6) < 1.25  # two panels per row, one row per image


def test_a_worse_new_is_rejected_with_the_reason(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    """The same model with 0.99 as its stored threshold flags nothing: more escapes than OLD."""
    strict = _edited(bundle_path, tmp_path, "strict.onnx",
                     thresholds={"threshold": 0.99, "threshold_source": "raised by hand"})  # fmt: skip
    result = runner.invoke(
        app, ["compare", str(bundle_path), str(strict), str(tiny_dataset), "--clean-auto", "--out",
              str(tmp_path / "out")],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    document = json.loads((tmp_path / "out" / "compare.json").read_text())
    old, new = document["models"]["old"], document["models"]["new"]
    assert old["escapes"]["escaped_images"] < old["escapes"]["defective_images"], "OLD must flag a board"
    assert new["escapes"]["escaped_images"] == new["escapes"]["defective_images"]
    assert new["threshold"] == {
        "value": 0.99,
        "source": "bundle metadata thresholds.threshold (raised by hand)",
    }
    assert old["mAP50"] == new["mAP50"]  # the same detections: only the threshold differs
    verdict = document["verdict"]
    assert verdict["decision"] == "keep OLD" and verdict["exit_code"] == 1
    failed = {check["name"] for check in verdict["checks"] if not check["passed"]}
    assert {"escape rate", "missed-defect rate"} <= failed and "mAP@0.5" not in failed
    assert any(reason.startswith("escape rate: NEW 1.0000 >") for reason in verdict["reasons"])
    assert "keep OLD" in result.output and "escape rate: NEW" in result.output
    flips = [
        item for item in document["disagreements"] if item["reason"] == "OLD flags it, NEW calls it clean"
    ]
    assert flips and all(item["new"]["detections"] == [] for item in flips)
    # the grid: OLD's panels (left) carry red prediction boxes, NEW's (right) none
    grid = cv2.cvtColor(cv2.imread(document["disagreements_png"]), cv2.COLOR_BGR2RGB)
    body = grid[80:]  # below the legend, which shows a red box
    red = np.abs(body.astype(int) - PRED_RGB).sum(axis=2) < 40
    middle = body.shape[1] // 2
    assert red[:, :middle].sum() > 50 and red[:, middle:].sum() == 0


def test_models_that_cannot_be_compared_are_refused_naming_the_difference(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    meta = read_metadata(bundle_path)
    names = list(meta.class_names)
    renamed = _edited(bundle_path, tmp_path, "renamed.onnx", class_names=["scratch", *names[1:]])
    with pytest.raises(
        InputError, match=rf"only OLD detects \['{names[0]}'\], only NEW detects \['scratch'\]"
    ):
        compare_models(bundle_path, renamed, tiny_dataset, out=tmp_path / "a")
    layout = meta.model_copy(update={"template": not meta.template, "channels": 3})
    with pytest.raises(
        InputError, match="layout: OLD compares each image with its template.*channels: OLD takes 1"
    ):
        check_comparable(meta, layout, Path("old.onnx"), Path("new.onnx"))
    # reordered classes are matched by name
    shuffled = _edited(bundle_path, tmp_path, "shuffled.onnx", class_names=[*names[1:], names[0]])
    document = compare_models(bundle_path, shuffled, tiny_dataset, clean_auto=True, out=tmp_path / "b")
    assert document["classes"]["matching"] == "same classes in another order; matched by name"
    # the same graph with other names: its boxes carry other classes, which the comparison sees
    assert document["disagreements"] and document["models"]["new"]["class_names"][0] == names[1]
    # NEW adding a class is matched by name too
    added = meta.model_copy(update={"class_names": [*names, "scratch"]})
    assert "NEW adds ['scratch']" in check_comparable(meta, added, Path("old.onnx"), Path("new.onnx"))


def test_the_command_exits_2_on_an_error(bundle_path: Path, tiny_dataset: Path, tmp_path: Path) -> None:
    renamed = _edited(bundle_path, tmp_path, "renamed.onnx",
                      class_names=["scratch", *read_metadata(bundle_path).class_names[1:]])  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "defectdet.cli", "compare", str(bundle_path), str(renamed), str(tiny_dataset),
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join(done.stderr.split())  # the console wraps long paths at its width
    assert "cannot be compared" in said and "scratch" in said


def test_false_calls_must_be_measured_to_promote(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    """The synthetic val boards all have defects: without clean boards the false-call rate is unknown."""
    document = compare_models(bundle_path, bundle_path, tiny_dataset, out=tmp_path)
    assert document["verdict"]["decision"] == "keep OLD"
    reasons = document["verdict"]["reasons"]
    assert reasons[0] == (
        "false-call rate not measured: no defect-free image in the split and no clean board: pass --clean DIR or "
        "--clean-auto"
    )
    near_zero_reasons = ["NEW finds almost none"] if _expected(document) == KEEP else []  # the tiny model
    assert [reason[:21] for reason in reasons[1:]] == near_zero_reasons


def test_a_folder_of_clean_boards_counts_its_false_calls(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    """--clean DIR with --clean-templates: each board is paired with its template by file name."""
    templates = sorted((tiny_dataset.parent / "templates" / "val").iterdir())
    boards, paired = tmp_path / "boards", tmp_path / "templates"
    boards.mkdir()
    paired.mkdir()
    for template in templates:
        shutil.copy(template, boards / template.name)  # the template itself: a perfect clean board
        shutil.copy(template, paired / template.name)
    document = compare_models(
        bundle_path, bundle_path, tiny_dataset, clean=boards, clean_templates=paired, out=tmp_path / "out"
    )
    calls = document["models"]["old"]["false_calls"]
    assert calls["clean_boards"] == len(templates) == document["clean_boards"]["count"]
    assert 0 <= calls["clean_board_false_calls"] <= len(templates)
    assert all(check["passed"] for check in document["verdict"]["checks"][:4])  # the false-call rate measured
    assert document["verdict"]["decision"] == _expected(document)
    with pytest.raises(InputError, match="has none"):
        compare_models(bundle_path, bundle_path, tiny_dataset, clean=boards, out=tmp_path / "missing")


def test_two_bundles_compare_without_torch(bundle_path: Path, tiny_dataset: Path, tmp_path: Path) -> None:
    """On a line PC without PyTorch: bundles need no export, so nothing imports torch."""
    from torch_blocker import BLOCK_TORCH

    script = BLOCK_TORCH + (
        "from defectdet.export.compare import compare_models\n"
        f"document = compare_models({str(bundle_path)!r}, {str(bundle_path)!r}, {str(tiny_dataset)!r}, "
        f"clean_auto=True, out={str(tmp_path)!r})\n"
        "assert 'torch' not in sys.modules\n"
        "print(document['verdict']['decision'].split()[0])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    document = json.loads((tmp_path / "compare.json").read_text())
    assert done.stdout.split()[-1] == _expected(document).split()[0]
