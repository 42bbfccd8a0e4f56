"""`train --from MODEL [--old-data OLD]` (issue 22 item 4): a fine-tune starts exactly from the deployed model
(checkpoint, or bundle with embedded weights), keeps its architecture, matches classes by name, mixes the old
training data in at a stated share and validates on both validation splits."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from defectdet.data.sample import DatasetSplit, Sample
from defectdet.engine.checkpoint import load_checkpoint
from defectdet.engine.config import DEFAULT_LEARNING_RATES, TrainConfig
from defectdet.engine.data_mix import mix_splits, new_repeat, remap_classes
from defectdet.engine.start_model import WEIGHTS_KEY, build_start_model, read_start
from defectdet.engine.trainer import Trainer, build_train_data, train
from defectdet.errors import CheckpointError, ConfigError

QUICK = {"device": "cpu", "workers": 0, "progress": False, "epochs": 1, "batch": 2, "warmup_steps": 1}


@pytest.fixture(scope="module")
def boards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 gray boards with templates, 160-192 px (data.yaml)."""
    from defectdet.data.synth import synthesize_dataset

    folder = tmp_path_factory.mktemp("finetune_data")
    return synthesize_dataset(folder, boards=6, seed=0, min_size=160, max_size=192, progress=False)


@pytest.fixture(scope="module")
def deployed(boards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """last.pt of two training steps (the "deployed" model: far from converged, exactness is the point)."""
    out = tmp_path_factory.mktemp("finetune_run")
    config = TrainConfig(**QUICK, data=boards, out=out, max_steps=2, val_split=None, pretrained=False)
    return train(config).last_checkpoint


def _with_names(data_yaml: Path, folder: Path, names: list[str]) -> Path:
    """A copy of data.yaml (same images and labels) with another class list."""
    values = yaml.safe_load(data_yaml.read_text())
    values.update(path=str(data_yaml.parent), names=names)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "data.yaml"
    target.write_text(yaml.safe_dump(values))
    return target


def _setup(config: TrainConfig) -> Trainer:
    from defectdet.engine.distributed import init_distributed

    data = build_train_data(config)
    trainer = Trainer(data.config, init_distributed("cpu"), data)
    trainer.setup()
    return trainer


def test_same_classes_start_exactly_and_keep_learning(boards, deployed, tmp_path) -> None:
    config = TrainConfig(**QUICK, data=boards, out=tmp_path / "ft", start_from=deployed, val_split=None)
    data = build_train_data(config)
    rows = {choice.name: choice for choice in data.choices}
    built_with = load_checkpoint(deployed)["config"]
    assert data.config.input_size == built_with["input_size"] and data.config.strides == built_with["strides"]
    for name in ("input_size", "strides", "channels", "template", "preset"):
        assert rows[name].source == "model" and f"[from model] {deployed.name}" in rows[name].reason
    assert rows["pretrained"].value is False and deployed.name in rows["pretrained"].reason
    assert data.config.lr == pytest.approx(DEFAULT_LEARNING_RATES["adamw"] / 10)
    assert rows["lr"].source == "auto" and "0.1 x the adamw default 0.008" in rows["lr"].reason
    trainer = _setup(config)
    start = read_start(deployed)
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(tensor.cpu(), start.state_dict[name]), name  # every tensor, classifier included
    # the fine-tune steps at its own lr lower the loss on a batch
    images, targets = next(iter(trainer.train_loader))[:2]
    model = trainer.model.train()
    losses = []
    for _ in range(6):
        loss = model(images, targets)["loss"]
        trainer.optimizer.zero_grad()
        loss.backward()
        trainer.optimizer.step()
        losses.append(float(loss.detach()))
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.0008)
    assert losses[-1] < losses[0]


def test_user_lr_wins_and_is_labelled(boards, deployed, tmp_path) -> None:
    config = TrainConfig(**QUICK, data=boards, out=tmp_path / "ft", start_from=deployed, lr=0.002)
    rows = {choice.name: choice for choice in build_train_data(config).choices}
    assert rows["lr"].value == 0.002 and rows["lr"].source == "user"


def test_an_added_class_keeps_the_old_rows_by_name(boards, deployed, tmp_path) -> None:
    start = read_start(deployed)
    names = [*start.class_names[:3], "dent", *start.class_names[3:]]
    model, summary = build_start_model(start, names)
    assert "['dent'] start fresh" in summary
    fresh = model.state_dict()
    for key, old in start.state_dict.items():
        if key.startswith("head.classifiers."):
            new = fresh[key]
            assert new.shape[0] == len(names) == old.shape[0] + 1
            for index, name in enumerate(names):
                if name != "dent":
                    assert torch.equal(new[index], old[start.class_names.index(name)]), (key, name)
            if key.endswith("bias"):  # the new class starts at the prior, not a copy of a neighbour
                assert new[3] == pytest.approx(-np.log(99.0), abs=1e-4)
        else:
            assert torch.equal(fresh[key], old), key
    # and through train(): the data's class list with the added name
    wider = _with_names(boards, tmp_path / "wider", names)
    config = TrainConfig(
        **QUICK, data=wider, out=tmp_path / "ft", start_from=deployed, max_steps=1, val_split=None
    )
    result = train(config)
    assert load_checkpoint(result.last_checkpoint)["class_names"] == names


def test_a_removed_class_or_another_layout_is_refused(boards, deployed, tmp_path) -> None:
    names = read_start(deployed).class_names
    narrower = _with_names(boards, tmp_path / "narrower", [*names[:-1], "scratch"])
    config = TrainConfig(**QUICK, data=narrower, out=tmp_path / "a", start_from=deployed)
    with pytest.raises(ConfigError, match=f"drop \\['{names[-1]}'\\], which {deployed.name} detects"):
        build_train_data(config)
    config = TrainConfig(**QUICK, data=boards, out=tmp_path / "b", start_from=deployed, template=False)
    with pytest.raises(ConfigError, match="field 'template': False was set, but last.pt was built with True"):
        build_train_data(config)
    config = TrainConfig(**QUICK, data=boards, out=tmp_path / "c", start_from=deployed, input_size=320)
    with pytest.raises(ConfigError, match="field 'input_size': 320 was set"):
        build_train_data(config)
    config = TrainConfig(**QUICK, data=boards, out=tmp_path / "d", start_from=deployed, resume=deployed)
    with pytest.raises(ConfigError, match="--from and --resume"):
        build_train_data(config)


def test_a_bundle_with_embedded_weights_starts_exactly(deployed, tmp_path, caplog) -> None:
    import onnx

    from defectdet.engine.bundle_model import BundleModel
    from defectdet.export.exporter import export_bundle

    with caplog.at_level(logging.ERROR):
        bundle = export_bundle(deployed, tmp_path / "model.onnx", data=tmp_path / "no-data").bundle
    start = read_start(bundle)
    assert start.kind == "bundle" and start.architecture == read_start(deployed).architecture
    model, summary = build_start_model(start, start.class_names)
    assert summary.startswith("all ")
    images = torch.rand(2, model.in_channels, 192, 192, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        eager = model.eval()(images)
    served = BundleModel(bundle)(images)
    assert eager.shape == served.shape
    assert torch.allclose(eager, served, atol=1e-4), float((eager - served).abs().max())
    # an older bundle, without the entry: a clear way out
    old = onnx.load(str(bundle))
    kept = [prop for prop in old.metadata_props if prop.key != WEIGHTS_KEY]
    del old.metadata_props[:]
    old.metadata_props.extend(kept)
    onnx.save(old, str(tmp_path / "old.onnx"))
    with pytest.raises(CheckpointError, match="re-export it from its checkpoint.*or pass the checkpoint"):
        read_start(tmp_path / "old.onnx")


def test_a_bundle_whose_metadata_does_not_describe_its_graph_is_refused(deployed, tmp_path, caplog) -> None:
    """Three class names over a graph of more: predict, serve and compare refuse it, and so does `--from`."""
    from defectdet.export.exporter import export_bundle
    from defectdet.runtime.bundle import read_metadata, write_metadata

    with caplog.at_level(logging.ERROR):
        bundle = export_bundle(deployed, tmp_path / "model.onnx", data=tmp_path / "no-data").bundle
    metadata = read_metadata(bundle)
    assert len(metadata.class_names) > 3
    write_metadata(bundle, metadata.model_copy(update={"class_names": metadata.class_names[:3]}))
    with pytest.raises(CheckpointError, match=r"'class_names' lists 3 class\(es\) but the graph"):
        read_start(bundle)


def _split(count: int, names: list[str], label: int = 0) -> DatasetSplit:
    samples = [
        Sample(Path(f"{names[0]}_{index}.png"), [[0, 0, 4, 4]], [label], source=f"{index}.txt")
        for index in range(count)
    ]
    return DatasetSplit(samples, names, "yolo", "train", Path("."))


def test_mixing_counts_and_class_remapping() -> None:
    assert new_repeat(100, 10, 0.3) == 5  # 50 of 150 = 33% >= 30%; x4 would be 40/140 = 29%
    assert new_repeat(10, 100, 0.3) == 1  # already the larger share: no repeat
    new, old = _split(10, ["open", "short", "dent"]), _split(100, ["short", "open"], label=1)
    old = remap_classes(old, new.class_names, "old.yaml")
    assert all(sample.classes.tolist() == [0] for sample in old.samples)  # "open" by name
    mixed, mix = mix_splits(new, old, 0.3)
    assert len(mixed.samples) == 150 and mix.new_repeat == 5 and mix.new_share == pytest.approx(1 / 3)
    assert mix.describe().startswith("old 100 + new 10 x5 images per epoch: new 33%")
    with pytest.raises(ConfigError, match=r"old.yaml: classes \['scratch'\] are not in the new data's"):
        remap_classes(_split(2, ["scratch"]), new.class_names, "old.yaml")


def test_old_data_is_mixed_in_and_validated_on(boards, deployed, tmp_path) -> None:
    from defectdet.data.synth import synthesize_dataset

    new = synthesize_dataset(tmp_path / "new", boards=3, seed=9, min_size=160, max_size=192, progress=False)
    config = TrainConfig(
        **QUICK,
        data=new,
        out=tmp_path / "ft",
        start_from=deployed,
        old_data=boards,
        max_steps=1,
        new_share=0.5,
        class_balance="off",  # counts as mixed (class balancing would repeat rare-class images on top)
    )
    data = build_train_data(config)
    rows = {choice.name: choice for choice in data.choices}
    old_count = len(list((boards.parent / "images" / "train").iterdir()))
    new_count = len(list((new.parent / "images" / "train").iterdir()))
    repeat = new_repeat(old_count, new_count, 0.5)
    assert rows["data mix"].value.startswith(f"old {old_count} + new {new_count} x{repeat} images per epoch")
    assert len(data.train) == old_count + repeat * new_count and data.old_val is not None
    result = train(data.config, data=data)
    with (result.run_dir / "metrics.csv").open() as handle:
        last = list(csv.DictReader(handle))[-1]
    assert last["mAP50"] != "" and last["val_old_mAP50"] != ""
    assert "# settings chosen" in (result.run_dir / "config.yaml").read_text()
    assert "data mix = old" in (result.run_dir / "config.yaml").read_text()


def test_old_data_needs_a_starting_model(boards, tmp_path) -> None:
    config = TrainConfig(**QUICK, data=boards, out=tmp_path / "x", old_data=boards)
    with pytest.raises(ConfigError, match="field 'old_data': only with start_from"):
        build_train_data(config)


def test_a_fine_tune_resumes_with_its_lr_and_data_mix(boards, deployed, tmp_path) -> None:
    first = TrainConfig(
        **QUICK, data=boards, out=tmp_path / "ft", start_from=deployed, old_data=boards, max_steps=1,
        val_split=None, class_balance="off",
    )  # fmt: skip
    result = train(first)
    again = TrainConfig(**{**QUICK, "epochs": 2}, data=boards, resume=result.last_checkpoint, max_steps=2)
    data = build_train_data(again)
    assert data.config.lr == pytest.approx(0.0008) and data.config.start_from == deployed
    assert any(choice.name == "data mix" for choice in data.choices)
    resumed = train(data.config, data=data)
    assert resumed.state.step == 2 and load_checkpoint(resumed.last_checkpoint)["config"][
        "lr"
    ] == pytest.approx(0.0008)


def test_train_cli_from_prints_the_model_rows(boards, deployed, tmp_path) -> None:
    from typer.testing import CliRunner

    from defectdet.cli import app

    args = ["train", str(boards), "--from", str(deployed), "--epochs", "1", "--batch", "2", "--workers", "0"]
    args += [
        "--out",
        str(tmp_path / "run"),
        "--set",
        "max_steps=1",
        "--set",
        "progress=false",
        "--device",
        "cpu",
    ]
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "[from model]" in result.output  # the table (wrapped to the terminal) marks the model's rows
    notes = (tmp_path / "run" / "config.yaml").read_text()
    assert "input_size = 192 [model]: [from model] last.pt" in notes and "0.1 x the adamw default" in notes
    bad = CliRunner().invoke(app, [*args[:4], "--resume", str(deployed)], terminal_width=200)
    assert isinstance(bad.exception, ConfigError) and "--from and --resume exclude" in str(bad.exception)


def test_embedded_weights_that_inflate_too_far_are_refused(monkeypatch) -> None:
    """A bundle is untrusted: a zlib bomb in its weights entry is refused before it fills memory."""
    import base64
    import zlib

    from defectdet.engine import start_model

    monkeypatch.setattr(start_model, "MAX_EMBEDDED_WEIGHTS_BYTES", 1 << 20)
    bomb = base64.b64encode(zlib.compress(b"\0" * (4 << 20), 9)).decode("ascii")
    with pytest.raises(CheckpointError, match="inflate beyond 1 MiB"):
        start_model.decode_weights(bomb, "evil.onnx")
    with pytest.raises(CheckpointError, match="unreadable"):
        start_model.decode_weights(base64.b64encode(zlib.compress(b"not torch")).decode("ascii"), "odd.onnx")


@pytest.mark.skipif(
    __import__("defectdet.model.imagenet", fromlist=["weights_path"]).weights_path() is None,
    reason="the ImageNet weights package is not installed",
)
def test_lite0_trains_from_imagenet_exports_and_fine_tunes_from_its_bundle(tmp_path, caplog) -> None:
    """The default without templates: ImageNet start, a bundle that matches eager, and `train --from` it."""
    from defectdet.data.synth import synthesize_dataset
    from defectdet.engine.bundle_model import BundleModel
    from defectdet.export.exporter import export_bundle

    data = synthesize_dataset(
        tmp_path / "surfaces", boards=6, seed=3, kind="surface", min_size=160, max_size=224, progress=False
    )
    quick = {**QUICK, "input_size": 160, "crop_size": 0, "preset": "lite0"}
    with caplog.at_level(logging.INFO):
        result = train(TrainConfig(**quick, data=data, out=tmp_path / "run", max_steps=2))
    assert "from ImageNet" in caplog.text
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (saved["preset"], saved["pretrained"], saved["backbone_lr_scale"]) == ("lite0", True, 0.25)
    with caplog.at_level(logging.ERROR):
        exported = export_bundle(result.last_checkpoint, tmp_path / "model.onnx", data=tmp_path / "no-data")
    assert exported.parity_max_abs_diff < 1e-3
    start = read_start(exported.bundle)
    model, summary = build_start_model(start, start.class_names)
    assert start.architecture["preset"] == "lite0" and summary.startswith("all ")
    images = torch.rand(1, model.in_channels, 160, 160, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        eager = model.eval()(images)
    assert torch.allclose(eager, BundleModel(exported.bundle)(images), atol=1e-4)
    tuned = train(
        TrainConfig(**quick, data=data, out=tmp_path / "tuned", max_steps=1, start_from=exported.bundle)
    )
    assert load_checkpoint(tuned.last_checkpoint)["model_config"]["preset"] == "lite0"
