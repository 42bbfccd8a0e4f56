"""The README's configuration reference is the typed config's, row for row."""

from __future__ import annotations

from pathlib import Path

from defectdet.data.augment import AugmentConfig
from defectdet.engine.config import TrainConfig
from defectdet.engine.config_reference import END_MARKER, START_MARKER, config_reference, field_comments

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_config_reference_matches_the_typed_config() -> None:
    text = README.read_text(encoding="utf-8")
    block = text[text.index(START_MARKER) + len(START_MARKER) : text.index(END_MARKER)].strip()
    assert block == config_reference(), (
        "README's configuration reference is stale: run `python -m defectdet.engine.config_reference --write README.md`"
    )


def test_every_field_has_a_row_and_comments_come_from_the_source() -> None:
    table = config_reference()
    for name in TrainConfig.model_fields:
        if name != "augment":
            assert f"| `{name}` |" in table, name
    for name in AugmentConfig.model_fields:
        assert f"| `augment.{name}` |" in table, name
    comments, sections = field_comments(TrainConfig)
    assert "multiple of 32" in comments["imgsz"]
    assert sections["data"] == "data" and "data" not in comments["data"]
