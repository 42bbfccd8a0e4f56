"""The generated reference pages (docs/reference) are the code's: a stale page or an undocumented option fails."""

from __future__ import annotations

import importlib.util
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
