import pickle
import random
import zipfile

import pytest
import torch
import torch.distributed as dist
import yaml
from torch import nn
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.diagnostics import checkpoint_report, migrate_checkpoint
from defectdet.engine.checkpoint import save_checkpoint
from defectdet.errors import CheckpointError, ConfigError
from defectdet.model import build_model


def nano():
    torch.manual_seed(0)
    return build_model("nano", num_classes=3, in_channels=2, template=True)


def assert_loads_strictly(path, model, key=None):
    state = torch.load(path, map_location="cpu", weights_only=True)
    fresh = nano()
    fresh.load_state_dict(state[key] if key else state, strict=True)
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name


def test_ddp_checkpoint_migrates_and_loads_strictly(tmp_path):
    model = nano()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        wrapped = nn.parallel.DistributedDataParallel(model)
        state = wrapped.state_dict()
    finally:
        dist.destroy_process_group()
    assert all(key.startswith("module.") for key in state)
    optimizer = torch.optim.AdamW(model.parameters())
    path = save_checkpoint(
        tmp_path / "ddp.pt",
        {
            "model": state,
            "optimizer": optimizer.state_dict(),
            "epoch": 7,
            "model_config": model.config,
            "version": 1,
        },
    )

    report = checkpoint_report(path)  # compared with the model its model_config describes
    assert report.layout == "defectdet checkpoint" and report.weights_key == "model"
    assert report.counts["match"] == 0 and report.counts["missing"] == len(model.state_dict())
    assert [rule.pattern for rule in report.proposed_rules] == [r"^module\."]
    assert "DistributedDataParallel" in report.proposed_rules[0].reason
    assert report.counts_after_proposal == {"match": len(state), "missing": 0, "unexpected": 0, "shape": 0}
    assert report.contents["epoch"] == "7" and report.contents["optimizer"].startswith("optimizer state")
    assert report.saved_devices == {"cpu": len(state)}
    assert any(f.severity == "error" and "--out" in f.advice for f in report.findings)

    result = migrate_checkpoint(path, tmp_path / "fixed.pt")
    assert result.loads_strictly, result.message
    assert_loads_strictly(result.out, model, key="model")
    assert torch.load(result.out, weights_only=True)["epoch"] == 7  # the rest of the checkpoint is kept


def test_compiled_model_checkpoint_migrates_and_loads_strictly(tmp_path):
    model = nano()
    state = torch.compile(model).state_dict()  # never run: only the key names matter
    assert all(key.startswith("_orig_mod.") for key in state)
    path = tmp_path / "compiled.pt"
    torch.save(state, path)

    report = checkpoint_report(path, model="nano", num_classes=3)
    assert report.layout == "bare state_dict" and report.target.startswith("preset nano (3 classes")
    assert [rule.reason for rule in report.proposed_rules] == ["'_orig_mod.' from torch.compile"]

    result = migrate_checkpoint(path, tmp_path / "fixed.pt", model="nano", num_classes=3)
    assert result.loads_strictly
    assert_loads_strictly(result.out, model)


class Net(nn.Module):
    def __init__(self, extra_norm: bool = False):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        self.head = nn.Conv2d(4, 2, 1)
        if extra_norm:
            self.head_norm = nn.BatchNorm2d(2)


def test_one_extra_batchnorm_lists_exactly_its_missing_keys(tmp_path):
    path = tmp_path / "plain.pt"
    torch.save(Net().state_dict(), path)
    report = checkpoint_report(path, model=Net(extra_norm=True))
    missing = [row.key for row in report.rows if row.status == "missing"]
    assert missing == [
        "head_norm.weight",
        "head_norm.bias",
        "head_norm.running_mean",
        "head_norm.running_var",
        "head_norm.num_batches_tracked",
    ]
    assert report.counts == {"match": 9, "missing": 5, "unexpected": 0, "shape": 0}
    assert report.proposed_rules == []
    error = next(f for f in report.findings if f.severity == "error")
    assert "5 missing" in error.message and "strict=False" in error.advice


def test_shifted_index_and_renamed_prefix_are_proposed(tmp_path):
    source = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 8, 1))
    target = nn.Sequential(nn.Identity(), nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 8, 1))
    path = tmp_path / "shifted.pt"
    torch.save({"state_dict": {f"model.{key}": value for key, value in source.state_dict().items()}}, path)
    report = checkpoint_report(path, model=target)
    assert report.layout == "dict, weights under 'state_dict'"
    reasons = [rule.reason for rule in report.proposed_rules]
    assert reasons[0] == "'model.' prefix on every key of the checkpoint"
    assert "shifted Sequential index under 'the top level' (0 -> 1)" in reasons
    result = migrate_checkpoint(path, tmp_path / "fixed.pt", model=target)
    assert result.loads_strictly
    fixed = torch.load(result.out, weights_only=True)["state_dict"]
    assert torch.equal(fixed["1.weight"], source[0].weight) and torch.equal(
        fixed["3.weight"], source[2].weight
    )


def test_user_mapping_file_and_its_errors(tmp_path):
    class Renamed(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
            self.head = nn.Conv2d(4, 2, 1)

    path = tmp_path / "old.pt"
    torch.save(Net().state_dict(), path)
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump([{"pattern": r"^body\.", "replace": "encoder."}]))
    report = checkpoint_report(path, model=Renamed(), rules=rules)
    assert report.counts == {"match": 9, "missing": 0, "unexpected": 0, "shape": 0}
    assert next(row for row in report.rows if row.key == "encoder.0.weight").source_key == "body.0.weight"
    result = migrate_checkpoint(path, tmp_path / "new.pt", model=Renamed(), rules=rules)
    assert result.loads_strictly

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump([{"pattern": "^body\\.", "replace": "x."}, {"pattern": "([", "replace": ""}])
    )
    with pytest.raises(ConfigError, match=r"bad.yaml: rule 2: invalid regex"):
        checkpoint_report(path, model=Renamed(), rules=bad)


def test_pickled_model_needs_unsafe(tmp_path):
    path = tmp_path / "whole.pt"
    torch.save(Net(), path)
    with pytest.raises(CheckpointError, match=r"whole.pt: holds pickled Python objects .*--unsafe"):
        checkpoint_report(path)
    report = checkpoint_report(path, model=Net(), unsafe=True)
    assert report.layout == "pickled model (Net)" and report.loads_strictly


def test_cli_checkpoint_migrates_and_reports_json(tmp_path):
    model = nano()
    path = tmp_path / "ddp.pt"
    torch.save({f"module.{key}": value for key, value in model.state_dict().items()}, path)
    runner = CliRunner()
    result = runner.invoke(app, ["doctor", "checkpoint", str(path), "--model", "nano", "--num-classes", "3"])
    assert result.exit_code == 1 and "What to do" in result.output and "module" in result.output
    out, rules = tmp_path / "fixed.pt", tmp_path / "rules.yaml"
    result = runner.invoke(
        app,
        ["doctor", "checkpoint", str(path), "--model", "nano", "--num-classes", "3", "--out", str(out)]
        + ["--save-map", str(rules)],
    )
    assert yaml.safe_load(rules.read_text()) == [{"pattern": r"^module\.", "replace": ""}]
    assert result.exit_code == 0, result.output
    assert "migrated" in result.output and "strict=True" in result.output
    assert_loads_strictly(out, model)
    result = runner.invoke(
        app, ["doctor", "checkpoint", str(out), "--model", "nano", "--num-classes", "3", "--json"]
    )
    assert result.exit_code == 0
    import json

    assert json.loads(result.output)["counts"]["match"] == len(model.state_dict())


def test_coincidental_equal_shapes_between_presets_are_not_proposed_as_renames(tmp_path):
    path = tmp_path / "nano.pt"
    torch.save(nano().state_dict(), path)
    report = checkpoint_report(path, model="tiny", num_classes=3)
    assert report.proposed_rules == [] and report.counts["shape"] > 100
    error = next(f for f in report.findings if f.severity == "error")
    assert "shape-mismatched" in error.message and "preset" in error.advice


def test_checkpoint_saved_on_cuda_is_read_on_the_cpu_and_says_so(tmp_path):
    """No GPU here: a higher-priority location tagger makes torch.save record 'cuda:0', as a GPU run would."""
    import torch.serialization as serialization

    def cuda_tag(storage):
        return "cuda:0" if storage.device.type == "cpu" else None

    entry = (0, cuda_tag, lambda storage, location: None)
    serialization._package_registry.insert(0, entry)
    try:
        torch.save(Net().state_dict(), tmp_path / "gpu.pt")
    finally:
        serialization._package_registry.remove(entry)
    if not torch.cuda.is_available():  # what the user meets without map_location
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(tmp_path / "gpu.pt", weights_only=True)
    report = checkpoint_report(tmp_path / "gpu.pt", model=Net())
    assert report.saved_devices == {"cuda:0": 9} and report.loads_strictly
    assert {row.device for row in report.rows} == {"cuda:0"}
    assert any("saved from cuda:0" in f.message for f in report.findings)


def test_pickled_models_in_a_dict_are_migrated_to_state_dicts(tmp_path):
    path = tmp_path / "ultralytics_style.pt"
    model = Net()
    torch.save({"model": model, "ema": model, "epoch": 3}, path)
    result = migrate_checkpoint(path, tmp_path / "fixed.pt", model=Net(), rules=[], unsafe=True)
    assert result.loads_strictly
    fixed = torch.load(tmp_path / "fixed.pt", weights_only=True)  # no pickled classes left
    assert set(fixed["ema"]) == set(model.state_dict()) and fixed["epoch"] == 3


def _written(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("name", "make", "says"),
    [
        ("random.pt", lambda: b"\x13\x37" + random.Random(0).randbytes(4094), "unknown bytes (13 37"),
        ("empty.pt", lambda: b"", "an empty file"),
        ("text.pt", lambda: b"epoch,loss\n1,0.5\n" * 4, "a text file (starts with 'epoch,loss"),
        ("damaged.pt", lambda: b"PK\x03\x04" + random.Random(1).randbytes(300), "a damaged zip archive"),
        ("pickle.pt", lambda: b"\x80\x04" + random.Random(2).randbytes(300), "a pickle stream (protocol 4)"),
    ],
)
def test_a_file_that_is_not_a_checkpoint_is_named_for_what_it_is(tmp_path, name, make, says):
    """Random bytes are not "pickled Python objects": the error says what the file is (empty, text, a zip
    archive, a pickle stream, unknown bytes) and never suggests --unsafe for bytes that hold no objects."""
    path = _written(tmp_path / name, make())
    with pytest.raises(CheckpointError) as caught:
        checkpoint_report(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and says in message, message
    assert "pickled Python objects" not in message


def test_a_zip_archive_without_torch_data_is_named(tmp_path):
    path = tmp_path / "notes.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", "not weights")
    with pytest.raises(CheckpointError, match=r"notes.pt: .*a zip archive that is not a torch checkpoint"):
        checkpoint_report(path)


def test_a_plain_pickle_is_named_and_only_loads_with_unsafe(tmp_path):
    path = tmp_path / "plain.pkl"
    path.write_bytes(pickle.dumps({"weights": [1, 2]}, protocol=4))
    with pytest.raises(CheckpointError, match=r"plain.pkl: .*a pickle stream \(protocol 4\).*--unsafe"):
        checkpoint_report(path)
