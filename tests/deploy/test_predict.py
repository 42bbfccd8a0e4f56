"""`predict` over folders: one bad file never stops the batch, same-named inputs never share an output, and a
DeepPCB folder (``ID_test.jpg`` beside ``ID_temp.jpg``) or a dataset folder (``images/`` beside ``templates/``)
pairs its templates by itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.data.formats import load_dataset

runner = CliRunner()


def _boards(dataset: Path, count: int) -> list[tuple[Path, Path]]:
    """(tested image, template) of the first `count` training boards."""
    samples = load_dataset(dataset, "train").samples[:count]
    return [(Path(s.image_path), Path(s.template_path)) for s in samples]


def _copy(source: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source.read_bytes())
    return target


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def _predict(*args: str) -> object:
    return runner.invoke(app, ["predict", *args, "--threshold", "0.0"])


@pytest.mark.parametrize("raised", [NotImplementedError, TypeError, AttributeError, ValueError])
def test_a_decoder_crash_on_one_file_is_listed_and_the_rest_are_predicted(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raised: type
) -> None:
    from defectdet.runtime.predictor import Predictor

    images, golden = tmp_path / "images", tmp_path / "golden"
    for index, (board, template) in enumerate(_boards(tiny_dataset, 3)):
        _copy(board, images / f"b{index}.png"), _copy(template, golden / f"b{index}.png")
    real_load_planes = Predictor.load_planes

    def load_planes(self, image, template, companions=None):
        if isinstance(image, Path) and image.name == "b1.png":
            raise raised("decoder bug on a malformed file")
        return real_load_planes(self, image, template, companions)

    monkeypatch.setattr(Predictor, "load_planes", load_planes)
    out = tmp_path / "out"
    result = _predict(str(bundle_path), str(images), "--templates", str(golden), "--out", str(out))
    assert result.exit_code == 1, result.output
    assert "1 file(s) failed" in result.output and "b1.png" in result.output
    assert raised.__name__ in result.output and "Traceback" not in result.output
    records = _records(out)
    assert [Path(r["file"]).name for r in records] == ["b0.png", "b1.png", "b2.png"]
    assert "error" in records[1] and raised.__name__ in records[1]["error"]
    assert sorted(p.name for p in (out / "labels").rglob("*.txt")) == ["b0.txt", "b2.txt"]


def test_inputs_of_the_same_name_in_different_folders_keep_their_own_outputs(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    """line1/board.png and line2/board.png (a glob over both) write labels/line1/board.txt and
    labels/line2/board.txt: the output tree mirrors the inputs' below their common folder, so no input's labels
    replace another's. Templates may mirror the same tree."""
    (board_a, template_a), (board_b, template_b) = _boards(tiny_dataset, 2)
    source, golden = tmp_path / "in", tmp_path / "golden"
    _copy(board_a, source / "line1" / "board.png"), _copy(template_a, golden / "line1" / "board.png")
    _copy(board_b, source / "line2" / "board.png"), _copy(template_b, golden / "line2" / "board.png")
    _copy(board_a, source / "line2" / "other.png"), _copy(template_a, golden / "other.png")  # by name
    out = tmp_path / "out"
    result = _predict(str(bundle_path), f"{source}/*/*.png", "--templates", str(golden), "--out", str(out))
    assert result.exit_code == 0, result.output
    records = {str(Path(r["file"]).relative_to(source)): r for r in _records(out)}
    assert set(records) == {"line1/board.png", "line2/board.png", "line2/other.png"}
    for relative, record in records.items():
        stem = relative.removesuffix(".png")
        assert record["labels"] == f"labels/{stem}.txt"
        labels = (out / "labels" / f"{stem}.txt").read_text().splitlines()
        assert len(labels) == len(record["detections"]) > 0
        assert (out / "images" / f"{stem}.png").is_file()
    assert not (out / "labels" / "board.txt").exists()


def test_inputs_that_differ_only_in_suffix_keep_their_own_outputs(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    (board, template), (other, other_template) = _boards(tiny_dataset, 2)
    source, golden = tmp_path / "in", tmp_path / "golden"
    _copy(board, source / "a.png"), _copy(template, golden / "a.png")
    _copy(other, source / "a.bmp"), _copy(other_template, golden / "a.bmp")
    _copy(board, source / "b.png"), _copy(template, golden / "b.png")
    out = tmp_path / "out"
    result = _predict(str(bundle_path), str(source), "--templates", str(golden), "--out", str(out))
    assert result.exit_code == 0, result.output
    by_name = {Path(r["file"]).name: r["labels"] for r in _records(out)}
    assert by_name == {"a.bmp": "labels/a.bmp.txt", "a.png": "labels/a.png.txt", "b.png": "labels/b.txt"}
    assert all((out / labels).is_file() for labels in by_name.values())


def _deeppcb_folder(dataset: Path, folder: Path, count: int = 2) -> list[str]:
    """DeepPCB's layout: ``ID_test.jpg`` beside its template ``ID_temp.jpg`` in one folder; returns the IDs."""
    import cv2

    folder.mkdir(parents=True)
    ids = []
    for index, (board, template) in enumerate(_boards(dataset, count)):
        ids.append(f"9000{index}")
        for path, suffix in ((board, "test"), (template, "temp")):
            image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
            assert cv2.imwrite(str(folder / f"{ids[-1]}_{suffix}.jpg"), image, [cv2.IMWRITE_JPEG_QUALITY, 98])
    return ids


@pytest.mark.parametrize("how", ["folder", "glob", "templates-same-folder"])
def test_a_deeppcb_folder_pairs_its_templates_and_never_predicts_them(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path, how: str
) -> None:
    """With ``ID_temp.jpg`` beside ``ID_test.jpg`` the template is found without --templates, and a template is
    never an input: not from the folder, not from a glob, not when --templates names the same folder."""
    boards = tmp_path / "group9000" / "9000"
    ids = _deeppcb_folder(tiny_dataset, boards)
    source = f"{boards}/*.jpg" if how == "glob" else str(boards)
    extra = ["--templates", str(boards)] if how == "templates-same-folder" else []
    out = tmp_path / "out"
    result = _predict(str(bundle_path), source, *extra, "--out", str(out))
    assert result.exit_code == 0, result.output
    records = _records(out)
    assert [Path(r["file"]).name for r in records] == [f"{i}_test.jpg" for i in ids]
    assert all("error" not in r and r["detections"] for r in records)
    assert sorted(p.name for p in (out / "labels").rglob("*.txt")) == [f"{i}_test.txt" for i in ids]


def test_a_deeppcb_template_pairs_only_by_its_partners_name(tmp_path: Path) -> None:
    from defectdet.runtime.predict import pair_template, template_inputs

    folder = tmp_path / "boards"
    folder.mkdir()
    for name in ("1_test.jpg", "1_temp.jpg", "2_test.png", "2_temp.png", "3_test.jpg", "a.png", "a.bmp"):
        (folder / name).write_bytes(b"x")
    assert pair_template(folder / "1_test.jpg", None) == folder / "1_temp.jpg"
    assert pair_template(folder / "2_test.png", None) == folder / "2_temp.png"
    assert pair_template(folder / "3_test.jpg", None) is None
    assert pair_template(folder / "a.png", None) is None  # a.bmp beside it is another board, not its template
    golden = tmp_path / "golden"
    golden.mkdir()
    (golden / "1_test.jpg").write_bytes(b"x")
    assert pair_template(folder / "1_test.jpg", golden) == golden / "1_test.jpg"  # --templates first
    assert pair_template(folder / "2_test.png", golden) == folder / "2_temp.png"  # then beside it
    inputs = sorted(folder.iterdir())
    assert template_inputs(inputs, None) == {folder / "1_temp.jpg", folder / "2_temp.png"}
    assert template_inputs(inputs, folder) == {folder / "1_temp.jpg", folder / "2_temp.png"}


def test_a_dataset_folder_gives_its_templates_without_the_option(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    """A template model predicting the images of a dataset folder (images/val/) finds their templates where
    `train` found them (templates/val/), so `predict line3.onnx line3/images/val/` needs no --templates."""
    images = tiny_dataset.parent / "images" / "val"
    out = tmp_path / "out"
    result = _predict(str(bundle_path), str(images), "--out", str(out))
    assert result.exit_code == 0, result.output
    records = _records(out)
    assert sorted(Path(r["file"]).name for r in records) == sorted(p.name for p in images.iterdir())
    assert all(
        Path(r["template"]) == tiny_dataset.parent / "templates" / "val" / Path(r["file"]).name
        for r in records
    )
    loose = _copy(sorted(images.iterdir())[0], tmp_path / "loose" / "board.png")
    result = _predict(str(bundle_path), str(loose), "--out", str(tmp_path / "loose_out"))
    assert (
        result.exit_code == 1 and "--templates" in result.output
    )  # outside a dataset folder: say what to pass


def test_a_dataset_template_is_looked_up_in_the_tree_beside_images(tmp_path: Path) -> None:
    from defectdet.runtime.predict import dataset_template, pair_template

    for name in (
        "images/val/a.png",
        "templates/val/a.jpg",
        "images/b.png",
        "templates/b.png",
        "images/val/c.png",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    assert dataset_template(tmp_path / "images" / "val" / "a.png") == tmp_path / "templates" / "val" / "a.jpg"
    assert dataset_template(tmp_path / "images" / "b.png") == tmp_path / "templates" / "b.png"  # one folder
    assert dataset_template(tmp_path / "images" / "val" / "c.png") is None
    assert dataset_template(tmp_path / "templates" / "val" / "a.jpg") is None  # not under images/
    golden = tmp_path / "golden"
    golden.mkdir()
    assert (
        pair_template(tmp_path / "images" / "val" / "a.png", golden) is None
    )  # --templates is taken at its word


def test_predict_source_takes_bundles_and_resolve_bundle_exports_checkpoints(tmp_path: Path) -> None:
    """The torch-free `runtime.predict` never exports: a checkpoint is refused with the way out, while
    `export.resolve.resolve_bundle` (what `defectdet predict` calls first) passes a bundle through untouched."""
    from defectdet.errors import InputError
    from defectdet.export.resolve import resolve_bundle
    from defectdet.runtime.predict import predict_source

    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(b"unused")
    with pytest.raises(InputError, match="export it first"):
        predict_source(checkpoint, tmp_path, tmp_path / "out")
    assert resolve_bundle(tmp_path / "model.onnx", tmp_path / "work") == tmp_path / "model.onnx"
    assert not (tmp_path / "work").exists()
    with pytest.raises(InputError, match="no such checkpoint or bundle"):
        resolve_bundle(tmp_path / "missing.pt", tmp_path / "work")
