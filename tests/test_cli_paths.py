"""A path the CLI prints stays on one line at any terminal width, so it can be copied as it is."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from defectdet.cli import app


def test_a_long_output_path_is_printed_whole_on_one_line(tmp_path: Path) -> None:
    out = tmp_path / ("a_rather_long_folder_name_for_line_3_of_the_plant_" * 3) / "data"
    result = CliRunner().invoke(app, ["synth", str(out), "--boards", "2"], terminal_width=80)
    assert result.exit_code == 0, result.output
    data_yaml = str(out / "data.yaml")
    assert len(data_yaml) > 80
    assert any(line.endswith(data_yaml) for line in result.output.splitlines()), result.output
