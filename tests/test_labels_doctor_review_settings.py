"""The options of `labels`, `doctor` and `review` come from their settings models and reach the library functions
as those settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.data.formats.label_settings import CocoImportSettings, LabelStudioImportSettings
from defectdet.diagnostics.doctor_settings import LoaderDoctorSettings, NanDoctorSettings
from defectdet.serve.review_settings import ReviewSettings

runner = CliRunner()


class _Stop(Exception):
    """Raised by a stand-in once it has seen the settings the command passed."""


def _recorder(seen: list[Any]):
    def stand_in(*args: Any, **kwargs: Any) -> None:
        seen.append(args[-1])
        raise _Stop

    return stand_in


def test_import_coco_options_become_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    import defectdet.data.formats.cvat as cvat

    seen: list[Any] = []
    monkeypatch.setattr(cvat, "import_coco", _recorder(seen))
    given = "--classes short,open --images a --images b --skip-unknown --no-crowd --existing merge".split()

    result = runner.invoke(app, ["labels", "import-coco", "export/", "out/", *given])

    assert isinstance(result.exception, _Stop), result.output
    assert seen == [
        CocoImportSettings(
            classes=["short", "open"],
            images=[Path("a"), Path("b")],
            skip_unknown=True,
            keep_crowd=False,
            existing="merge",
        )
    ]
    assert seen[0].unknown == "skip" and seen[0].split is None and seen[0].val_fraction == 0.2


def test_import_labelstudio_refuses_two_unknown_class_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    import defectdet.data.formats.labelstudio as labelstudio

    seen: list[Any] = []
    monkeypatch.setattr(labelstudio, "import_export", _recorder(seen))
    result = runner.invoke(
        app, ["labels", "import-labelstudio", "e.json", "out/", "--add-classes", "--skip-unknown"]
    )
    assert result.exit_code == 2 and "exclude each other" in result.output and not seen
    with pytest.raises(ValueError, match="exclude each other"):
        LabelStudioImportSettings(add_classes=True, skip_unknown=True)

    result = runner.invoke(
        app, ["labels", "import-labelstudio", "e.json", "out/", "--split", "val", "--add-classes"]
    )
    assert isinstance(result.exception, _Stop), result.output
    assert seen == [LabelStudioImportSettings(split="val", add_classes=True)] and seen[0].unknown == "add"


def test_doctor_loader_and_nan_options_become_their_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    import defectdet.diagnostics.loader_doctor as loader_doctor
    import defectdet.diagnostics.sources as sources

    seen: list[Any] = []
    monkeypatch.setattr(loader_doctor, "loader_report", _recorder(seen))
    monkeypatch.setattr(sources, "checkpoint_nan_report", _recorder(seen))
    loader = "--workers 0,2 --batch 4 --input-size 64 --seconds 1 --scan 0".split()
    nan = "--batch 3 --dtype float16 --dtype bfloat16 --ema".split()

    assert isinstance(runner.invoke(app, ["doctor", "loader", "data.yaml", *loader]).exception, _Stop)
    assert isinstance(runner.invoke(app, ["doctor", "nan", "last.pt", "data.yaml", *nan]).exception, _Stop)

    assert seen == [
        LoaderDoctorSettings(
            workers=[0, 2], batch_size=4, input_size=64, seconds_per_setting=1.0, scan_limit=0
        ),
        NanDoctorSettings(batch_size=3, dtypes=["float16", "bfloat16"], use_ema=True),
    ]
    assert seen[0].train_overrides() == {"input_size": 64}
    bad = runner.invoke(app, ["doctor", "loader", "data.yaml", "--workers", "0,x"])
    assert bad.exit_code == 2 and "comma-separated integers" in bad.output


def test_review_options_become_its_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import defectdet.serve.review_app as review_app

    served: list[Any] = []
    monkeypatch.setattr(
        review_app,
        "run_review",
        lambda folder, host, port, settings, model: served.append(
            (host, port, settings.allowed_hosts, folder.class_names, model)
        ),
    )
    given = ["--port", "9001", "--allowed-host", "line3.local", "--classes", "short,open"]

    result = runner.invoke(app, ["review", str(tmp_path), *given], env={"DEFECTDET_TOKEN": ""})

    assert result.exit_code == 0, result.output
    ((host, port, allowed, names, model),) = served
    assert (host, port, model) == (ReviewSettings().host, 9001, None)
    assert "line3.local" in allowed and names[:2] == ["short", "open"]
