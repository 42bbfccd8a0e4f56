"""`predict` over folders: one bad file never stops the batch, same-named inputs never share an output, and a
DeepPCB folder (``ID_test.jpg`` beside ``ID_temp.jpg``) pairs its templates by itself."""

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
    return runner.invoke(app, ["predict", *args, "--conf", "0.0"])


@pytest.mark.parametrize("raised", [NotImplementedError, TypeError, AttributeError, ValueError])
def test_a_decoder_crash_on_one_file_is_listed_and_the_rest_are_predicted(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raised: type
) -> None:
    from defectdet.deploy.runtime import Predictor

    images, golden = tmp_path / "images", tmp_path / "golden"
    for index, (board, template) in enumerate(_boards(tiny_dataset, 3)):
        _copy(board, images / f"b{index}.png"), _copy(template, golden / f"b{index}.png")
    real_load_pair = Predictor.load_pair

    def load_pair(self, image, template):
        if isinstance(image, Path) and image.name == "b1.png":
            raise raised("decoder bug on a malformed file")
        return real_load_pair(self, image, template)

    monkeypatch.setattr(Predictor, "load_pair", load_pair)
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
