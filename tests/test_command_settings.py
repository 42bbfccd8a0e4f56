"""synth, export, predict and compare: options generated from their settings models (`SynthSettings`,
`ExportSettings`, `PredictSettings`, `CompareSettings`), and the library functions that take those models still
take their fields as keywords."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.cli_option import COMMAND_OPTION, CliOption
from defectdet.cli_settings import SETTINGS_OPTIONS, settings_options
from defectdet.compat import with_keywords
from defectdet.data.synth.settings import SynthSettings
from defectdet.export.compare_settings import CompareSettings
from defectdet.export.export_settings import ExportSettings
from defectdet.runtime.compare_rule import Tolerances
from defectdet.runtime.predict_settings import PredictSettings

runner = CliRunner()


class _Stop(Exception):
    """Raised by a stand-in library function once it has recorded what it was given."""


def _recorder(seen: list[Any], position: int) -> Any:
    def record(*args: Any, **keywords: Any) -> None:
        seen.append(args[position])
        raise _Stop

    return record


def test_a_command_option_is_listed_where_the_table_places_it() -> None:
    options = {
        "split": CliOption(help="Split."),
        "out": COMMAND_OPTION,
        "threads": CliOption(help="Threads."),
    }
    received: dict[str, Any] = {}
    tool = typer.Typer()

    @tool.command()
    @settings_options(CompareSettings, options)
    def run(
        settings: dict[str, Any] = SETTINGS_OPTIONS,
        out: Path = typer.Option(Path("here"), help="Where."),
    ) -> None:
        """Record the settings."""
        received.update(settings, out=out)

    shown = runner.invoke(tool, ["--help"], env={"COLUMNS": "200", "NO_COLOR": "1"}).output
    assert re.findall(r"--(split|out|threads)\b", shown) == ["split", "out", "threads"]
    result = runner.invoke(tool, ["--threads", "2", "--out", "there"])
    assert result.exit_code == 0, result.output
    assert received == {"split": "val", "threads": 2, "out": Path("there")}


def test_a_command_option_the_command_lacks_is_refused() -> None:
    with pytest.raises(TypeError, match="no parameter out"):

        @settings_options(CompareSettings, {"out": COMMAND_OPTION})
        def run(settings: dict[str, Any] = SETTINGS_OPTIONS) -> None:
            """Nothing."""


def test_synth_settings_come_from_the_given_options(monkeypatch: pytest.MonkeyPatch) -> None:
    import defectdet.data.synth as synth

    seen: list[Any] = []
    monkeypatch.setattr(synth, "synthesize_dataset", _recorder(seen, 1))
    given = ["--kind", "surface", "--materials", "tile, weave", "--shift", "lamp,lens", "--companion", "L2"]

    result = runner.invoke(app, ["synth", "out", *given, "--gray"])

    assert isinstance(result.exception, _Stop), result.output
    assert seen == [
        SynthSettings(
            kind="surface",
            materials=("tile", "weave"),
            shift=("lamp", "lens"),
            companions=("L2",),
            color=False,
        )
    ]


def test_export_settings_come_from_the_given_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import defectdet.export.exporter as exporter

    seen: list[Any] = []
    monkeypatch.setattr(exporter, "export_bundle", _recorder(seen, 2))
    given = ["--format", "pt2", "--format", "torchscript", "--no-merge-fragments", "--flip-views", "lr"]

    result = runner.invoke(app, ["export", str(tmp_path / "best.pt"), *given, "--data", "data.yaml"])

    assert isinstance(result.exception, _Stop), result.output
    assert seen == [
        ExportSettings(
            formats=("pt2", "torchscript"), merge_fragments=False, flip_views="lr", data=Path("data.yaml")
        )
    ]


def test_predict_settings_come_from_the_given_options(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import defectdet.export.resolve as resolve
    import defectdet.runtime.predict as runtime_predict

    seen: list[Any] = []
    monkeypatch.setattr(resolve, "resolve_bundle", lambda model, out, views: seen.append(views) or model)
    monkeypatch.setattr(runtime_predict, "predict_source", _recorder(seen, 3))
    given = ["--companion", f"L2={tmp_path}", "--threshold", "0.4", "--no-save-images", "--flip-views", "lr"]

    result = runner.invoke(app, ["predict", "model.onnx", "images/", *given])

    assert isinstance(result.exception, _Stop), result.output
    assert seen == [
        "lr",
        PredictSettings(companions={"L2": tmp_path}, threshold=0.4, save_images=False, flip_views="lr"),
    ]


def test_compare_settings_come_from_the_given_options(monkeypatch: pytest.MonkeyPatch) -> None:
    import defectdet.export.compare as compare

    seen: list[Any] = []
    monkeypatch.setattr(compare, "compare_models", _recorder(seen, 3))

    result = runner.invoke(
        app, ["compare", "old.onnx", "new.pt", "data.yaml", "--clean-auto", "--tol-map", "0.02"]
    )

    assert isinstance(result.exception, _Stop), result.output
    (settings,) = seen
    assert settings == CompareSettings(clean_auto=True, tol_map=0.02, progress=True)
    assert settings.tolerances == Tolerances(map50=0.02)


def test_keywords_apply_over_the_settings_and_unknown_ones_are_refused() -> None:
    base = ExportSettings(int8=True)
    assert with_keywords(ExportSettings, base, {"split": "test"}, "export_bundle") == ExportSettings(
        int8=True, split="test"
    )
    assert with_keywords(ExportSettings, None, {}, "export_bundle") == ExportSettings()
    with pytest.raises(TypeError, match=r"export_bundle\(\) got an unexpected keyword argument 'colour'"):
        with_keywords(ExportSettings, None, {"colour": 1}, "export_bundle")


def test_retired_keywords_still_work_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"predict_source\(\): 'conf' is deprecated: use 'threshold'"):
        assert PredictSettings(conf=0.3).threshold == 0.3


def test_compare_takes_whole_tolerances_or_their_fields() -> None:
    from defectdet.export.compare_settings import tolerance_keywords

    assert CompareSettings(tolerances=Tolerances(escape=0.1)).tol_escape == 0.1
    assert tolerance_keywords({"tolerances": None, "split": "test"}) == {
        "split": "test",
        "tol_escape": 0.005,
        "tol_map": 0.01,
        "tol_false_call": 0.01,
    }
    with pytest.raises(TypeError, match="either tolerances or tol_map"):
        tolerance_keywords({"tolerances": Tolerances(), "tol_map": 0.1})


def test_synthesize_dataset_writes_the_shifted_line_it_is_given(tmp_path: Path) -> None:
    import json

    from defectdet.data.synth import synthesize_dataset
    from defectdet.data.synth.shift import SHIFT_RECORD

    settings = SynthSettings(boards=2, min_size=64, max_size=64, progress=False)
    data_yaml = synthesize_dataset(tmp_path / "line", settings, shift=("lens",))

    record = json.loads((data_yaml.parent / SHIFT_RECORD).read_text())
    assert (record["shifts"], record["images"]) == (["lens"], 2)
