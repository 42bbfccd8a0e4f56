import json
import sys

import pytest
import torch
from typer.testing import CliRunner

from defectdet.cli import app, main


def test_doctor_without_a_command_reports_the_environment_as_json():
    result = CliRunner().invoke(app, ["doctor", "--seconds", "0", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["versions"]["torch"] == torch.__version__
    assert report["torch_threads"] == torch.get_num_threads() and report["speed"] is None


def test_doctor_tensor_flags_a_saved_transposed_view(tmp_path):
    base = torch.randn(6, 4)
    torch.save({"base": base, "transposed": base.t()}, tmp_path / "tensors.pt")
    result = CliRunner().invoke(
        app, ["doctor", "tensor", str(tmp_path / "tensors.pt")], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "transposed: not contiguous (strides [1, 4])" in result.output
    assert "shares its storage with base" in result.output and "What to do" in result.output


def test_user_errors_print_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "missing.pt"
    monkeypatch.setenv("COLUMNS", "400")  # rich would wrap a long path at 80 columns
    monkeypatch.setattr(sys, "argv", ["defectdet", "doctor", "checkpoint", str(missing)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {missing}: checkpoint file not found"]
