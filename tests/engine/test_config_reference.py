"""The configuration reference page (docs/reference/configuration.md) is the typed config's, row for row."""

from __future__ import annotations

from pathlib import Path

from defectdet.engine.config import TrainConfig
from defectdet.engine.config_reference import END_MARKER, START_MARKER, config_reference, field_comments
from defectdet.trainingdata.augment import AugmentConfig

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "configuration.md"


def test_config_reference_page_matches_the_typed_config() -> None:
    text = PAGE.read_text(encoding="utf-8")
    block = text[text.index(START_MARKER) + len(START_MARKER) : text.index(END_MARKER)].strip()
    assert block == config_reference(), (
        "docs/reference/configuration.md is stale: run `python scripts/gen_reference.py`"
    )


def test_every_field_has_a_row_and_comments_come_from_the_source() -> None:
    table = config_reference()
    for name in TrainConfig.model_fields:
        if name != "augment":
            assert f"| `{name}` |" in table, name
    for name in AugmentConfig.model_fields:
        assert f"| `augment.{name}` |" in table, name
    comments, sections = field_comments(TrainConfig)
    assert "multiple of 32" in comments["input_size"]
    assert sections["data"] == "data" and comments["data"].startswith("data.yaml")  # not the heading
