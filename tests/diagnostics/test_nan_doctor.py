import torch
from torch import nn
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.diagnostics import nan_report


def overflow_model(scale: float) -> nn.Sequential:
    """Linear -> ReLU -> a Linear whose outputs reach ~3e5 (beyond float16's 65504) -> ReLU -> Linear."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    with torch.no_grad():
        model[0].weight.abs_()
        model[2].weight.fill_(scale)
        model[2].bias.zero_()
    return model


def test_hand_made_overflow_is_named_as_the_first_nan_source_with_its_dtype():
    model = overflow_model(1e5)
    batches = [torch.rand(2, 4) + 1]
    report = nan_report(model, batches, dtypes=[torch.float32, torch.bfloat16, torch.float16])
    float32, bfloat16, float16 = report.passes
    assert float32.finite and bfloat16.finite  # bfloat16 has float32's range
    source = float16.forward_source
    assert (source.module, source.module_type, source.dtype, source.phase) == (
        "2",
        "Linear",
        "float16",
        "forward",
    )
    assert not source.input_was_bad and source.bad_parameters == []
    assert float32.max_activation_module == "2" and float32.max_activation > 65504
    error = next(f for f in report.findings if f.topic == "float16 autocast")
    assert "'2' (Linear)" in error.message and "overflow of the float16 range" in error.message
    dtype = next(f for f in report.findings if f.topic == "dtype")
    assert dtype.message == "fails in float16 autocast; finite in float32, bfloat16 autocast"
    assert torch.equal(model[2].weight, torch.full((8, 8), 1e5))  # the model itself is untouched


def test_default_dtypes_on_cpu_are_float32_and_bfloat16():
    report = nan_report(overflow_model(1.0), [torch.rand(2, 4)])
    assert [result.name for result in report.passes] == ["float32", "bfloat16 autocast"]
    assert all(result.finite for result in report.passes)
    assert all(len(result.losses) == 1 for result in report.passes)


class LogOf(nn.Module):
    def forward(self, x):
        return torch.log(x - 10)  # NaN for every input below 10, in any dtype


def test_bad_operation_bad_input_and_bad_weights_are_told_apart():
    model = nn.Sequential(nn.Linear(4, 4), LogOf(), nn.Linear(4, 1))
    report = nan_report(model, [torch.rand(2, 4)], dtypes=[torch.float32])
    source = report.passes[0].forward_source
    assert (source.module, source.module_type, source.kind, source.input_was_bad) == (
        "1",
        "LogOf",
        "nan",
        False,
    )
    assert "the operation itself" in report.findings[0].message

    clean = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    images = torch.rand(2, 4)
    images[1, 2] = float("nan")
    source = nan_report(clean, [images], dtypes=[torch.float32]).passes[0].forward_source
    assert source.module == "0" and source.input_was_bad
    with torch.no_grad():
        clean[2].weight[0, 1] = float("inf")
    report = nan_report(clean, [torch.rand(2, 4)], dtypes=[torch.float32])
    assert report.bad_parameters == ["2.weight"]
    source = report.passes[0].forward_source
    assert source.module == "2" and source.bad_parameters == ["weight"]


def test_cli_nan_on_a_training_checkpoint(tmp_path):
    from defectdet.data.synth import synthesize_dataset
    from defectdet.engine.checkpoint import save_checkpoint
    from defectdet.model import build_model

    data = synthesize_dataset(tmp_path / "synth", boards=3, seed=0, min_size=64, max_size=80)
    model = build_model("nano", num_classes=7, in_channels=2, template=True)
    checkpoint = {"model": model.state_dict(), "model_config": model.config, "version": 1, "ema": None}
    checkpoint["config"] = {"imgsz": 64, "crop_size": None, "train_split": "train"}
    save_checkpoint(tmp_path / "last.pt", checkpoint)
    result = CliRunner().invoke(
        app,
        ["doctor", "nan", str(tmp_path / "last.pt"), str(data), "--batches", "1", "--batch", "1", "--json"],
    )
    assert result.exit_code == 0, result.output
    import json

    report = json.loads(result.output)
    assert [p["name"] for p in report["passes"]] == ["float32", "bfloat16 autocast"]
    assert all(p["forward_source"] is None and p["losses"] for p in report["passes"])
    layers = {layer["module"] for layer in report["passes"][0]["layers"]}
    assert "backbone" in layers and "head" in layers  # hooks on every module


def test_bad_dtype_and_missing_cuda_are_user_errors(tmp_path):
    import pytest

    from defectdet.diagnostics import checkpoint_nan_report
    from defectdet.diagnostics.doctor_settings import NanDoctorSettings
    from defectdet.diagnostics.sources import resolve_device
    from defectdet.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--dtype: unknown \['float8'\]"):
        checkpoint_nan_report(tmp_path / "last.pt", tmp_path, NanDoctorSettings(dtypes=["float8"]))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
