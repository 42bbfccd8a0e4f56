"""The generated reference pages (docs/reference) are the code's: a stale page or an undocumented option fails."""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from pathlib import Path

import typer
import typer.main

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
gen = importlib.util.module_from_spec(_spec)
sys.modules["gen_reference"] = gen
_spec.loader.exec_module(gen)


def test_generated_pages_match_the_code() -> None:
    stale = [
        str(path.relative_to(ROOT)) for path, text in gen.pages().items() if path.read_text("utf-8") != text
    ]
    assert not stale, f"{stale} are stale: run `python scripts/gen_reference.py`"


def test_every_command_and_option_is_described_on_the_page() -> None:
    command = gen.cli_command()
    assert gen.undocumented(command) == []
    page = (ROOT / "docs" / "reference" / "cli.md").read_text("utf-8")
    assert gen.missing_on_page(page, command) == []
    names = [name for name, _ in gen.walk(command)]
    assert {"defectdet train", "defectdet labels import-coco", "defectdet doctor"} <= set(names)


def _planted() -> object:
    """A copy of the CLI whose `train` has one more option, without help."""
    donor = typer.Typer()

    @donor.command()
    def planted(planted_option: int = typer.Option(3, "--planted-option")) -> None:
        """Has an option without help."""

    option = typer.main.get_command(donor).params[0]
    command = gen.cli_command()  # typer builds a fresh command tree on each call
    command.commands["train"].params.append(option)
    return command


def test_a_planted_undocumented_option_is_reported() -> None:
    command = _planted()
    assert gen.undocumented(command) == ["defectdet train --planted-option"]
    committed = (ROOT / "docs" / "reference" / "cli.md").read_text("utf-8")
    assert gen.missing_on_page(committed, command) == ["defectdet train --planted-option"]
    regenerated = gen.render_cli(command)
    assert "| `--planted-option` | int | `3` |  |" in regenerated
    assert gen.missing_on_page(regenerated, command) == ["defectdet train --planted-option"]
    assert gen.undocumented(gen.cli_command()) == []  # the app itself is untouched


def test_the_http_page_lists_every_route_of_the_schema() -> None:
    document = gen.openapi_schema()
    page = (ROOT / "docs" / "reference" / "http-api.md").read_text("utf-8")
    for path, methods in document["paths"].items():
        for method in methods:
            assert f"### `{method.upper()} {path}`" in page
    assert "/v1/detect" in document["paths"] and "/v1/review/decide" in document["paths"]
    assert "cdn" not in page.lower() and "swagger" not in page.lower()
    undescribed = [line for line in page.splitlines() if line.startswith("| `") and line.endswith("|  |")]
    assert not undescribed, f"HTTP parameters or fields without a description: {undescribed}"


def test_the_bundle_format_page_names_every_metadata_field() -> None:
    from defectdet.runtime.bundle import BundleMetadata, Thresholds

    page = (ROOT / "docs" / "reference" / "bundle-format.md").read_text("utf-8")
    missing = [
        name
        for model in (BundleMetadata, Thresholds)
        for name in model.model_fields
        if f"`{name}`" not in page
    ]
    assert not missing, f"docs/reference/bundle-format.md does not describe {missing}"


PROVENANCE = re.compile(r"bench/|[Ii]ssue \d|\.\./shared|\bstop \d|\brung\b|\barms\b|EPYC|Xeon")
API = ("train", "validate", "export_bundle", "predict", "compare", "Predictor", "serve_bundle")


def _user_text() -> dict[str, str]:
    """Every help text of the CLI and the docstring of every public Python name, by where it is read."""
    import defectdet

    texts = {}
    for name, command in gen.walk(gen.cli_command()):
        texts[name] = command.help or ""
        texts.update({f"{name} {gen.option_names(p)}": gen.param_help(p) for p in command.params})
    for name in defectdet.__all__[1:]:
        value = getattr(defectdet, name)
        texts[f"defectdet.{name}"] = inspect.getdoc(value) or ""
    texts["Predictor.predict"] = inspect.getdoc(defectdet.Predictor.predict) or ""
    return texts


def test_help_and_docstrings_speak_about_the_product() -> None:
    texts = _user_text()
    found = {where: PROVENANCE.findall(text) for where, text in texts.items() if PROVENANCE.search(text)}
    assert not found, f"benchmark provenance, work items or local paths in user text: {found}"
    assert PROVENANCE.findall("11x slower on an AMD EPYC (bench/results/amp_cpu.json), see issue 19") == [
        "EPYC",
        "bench/",
        "issue 1",
    ]


def test_every_python_entry_point_has_a_docstring_example() -> None:
    import defectdet

    for name in API:
        assert name in defectdet.__all__
        value = getattr(defectdet, name)
        doc = inspect.getdoc(value) or ""
        assert "Example" in doc and f"from defectdet import {name}" in doc, name


def test_the_configuration_page_example_loads(tmp_path: Path) -> None:
    from defectdet.engine.config import load_config

    page = (ROOT / "docs" / "reference" / "configuration.md").read_text("utf-8")
    example = page.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "run.yaml").write_text(example)
    config = load_config(tmp_path / "run.yaml")
    assert config.time_minutes == 20 and config.augment.horizontal_flip == 0.5


def test_every_configuration_key_has_a_meaning() -> None:
    page = (ROOT / "docs" / "reference" / "configuration.md").read_text("utf-8")
    empty = [
        line.split("`")[1] for line in page.splitlines() if line.startswith("| `") and line.endswith("|  |")
    ]
    assert not empty, f"configuration keys without a comment in the code: {empty}"


def test_the_configuration_page_speaks_in_values_not_in_code() -> None:
    """Defaults a user can read (the learning rates themselves), no internal module paths or constant names."""
    from defectdet.engine.config import DEFAULT_LEARNING_RATES, DEFAULT_WEIGHT_DECAY, VAL_BUDGET_SHARE

    page = (ROOT / "docs" / "reference" / "configuration.md").read_text("utf-8")
    rows = {line.split("`")[1]: line for line in page.splitlines() if line.startswith("| `")}
    for key, defaults in (("lr", DEFAULT_LEARNING_RATES), ("weight_decay", DEFAULT_WEIGHT_DECAY)):
        for optimizer, value in defaults.items():
            assert f"{value:g} ({optimizer})" in rows[key], (key, optimizer)
    assert VAL_BUDGET_SHARE == 0.1 and "each tenth of the budget" in rows["val_every"]
    internal = re.compile(r"\((?:engine|model|data|runtime|serve|evaluation)\.\w+|\b[A-Z]{2,}_[A-Z_]{2,}\b")
    assert not [key for key, line in rows.items() if internal.search(line)]
