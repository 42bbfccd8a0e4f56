"""What `defectdet predict` really writes goes to Label Studio as pre-annotations and, accepted there, comes back
as the same boxes (issue 22 item 3, on a real bundle rather than a hand-written predictions.jsonl)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.data.formats import load_dataset

runner = CliRunner()


def test_predict_output_to_label_studio_and_back(
    bundle_path: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    images, golden = tmp_path / "line", tmp_path / "golden"
    for sample in load_dataset(tiny_dataset, "train").samples[:3]:
        for source, folder in ((sample.image_path, images), (sample.template_path, golden)):
            folder.mkdir(exist_ok=True)
            shutil.copyfile(source, folder / Path(source).name)
    pred = tmp_path / "pred"
    result = runner.invoke(
        app, ["predict", str(bundle_path), str(images), "--templates", str(golden), "--out", str(pred),
              "--threshold", "0.0", "--no-save-images"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (pred / "predictions.jsonl").read_text().splitlines()]
    assert sum(len(r["detections"]) for r in records) > 0
    tasks_path = tmp_path / "tasks.json"
    result = runner.invoke(app, ["labels", "export-labelstudio", str(pred), str(tasks_path)])
    assert result.exit_code == 0, result.output
    tasks = json.loads(tasks_path.read_text())
    assert len(tasks) == len(records)
    for number, task in enumerate(tasks, start=1):  # the annotator accepts every pre-annotation
        task["id"] = number
        task["annotations"] = [{"id": number, "result": task["predictions"][0]["result"]}]
    tasks_path.write_text(json.dumps(tasks))
    out = tmp_path / "dataset"
    result = runner.invoke(
        app, ["labels", "import-labelstudio", str(tasks_path), str(out), "--images", str(images),
              "--images", str(golden),  # the templates' folder: nothing outside the --images folders is read
              "--label-config", str(tmp_path / "tasks_config.xml"), "--split", "train"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    dataset = load_dataset(out, "train")
    class_names = (pred / "classes.txt").read_text().split()
    assert dataset.class_names == class_names  # the model's order: classes.txt -> the config
    by_name = {sample.image_path.name: sample for sample in dataset.samples}
    for record in records:
        sample = by_name[Path(record["file"]).name]
        expected = np.asarray([d["box"] for d in record["detections"]], np.float32).reshape(-1, 4)
        np.testing.assert_allclose(sample.boxes, expected, atol=1.0)
        assert [class_names[c] for c in sample.classes] == [d["class_name"] for d in record["detections"]]
        assert record["template"] == str(golden / sample.image_path.name)  # the pair comes along
        assert sample.template_path.read_bytes() == (golden / sample.image_path.name).read_bytes()
