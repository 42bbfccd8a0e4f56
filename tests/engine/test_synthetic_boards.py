"""`train --synthetic-boards N`: synthetic PCB boards join the training split, classes matched by name, drawn
once into a cache and reused; a resumed run keeps them; data without a matching class is refused."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from defectdet.cli import app
from defectdet.data.formats import load_dataset
from defectdet.data.synth import CLASS_NAMES, synthesize_dataset
from defectdet.engine.synthetic_boards import class_table, draw_boards, normalised, suggested_count
from defectdet.engine.trainer import _resumed_start, build_train_data
from defectdet.errors import ConfigError


@pytest.fixture(autouse=True)
def board_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEFECTDET_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_classes_match_by_name_across_spellings() -> None:
    # the class names of a public PCB dataset (PKU-Market-PCB style) against the synthetic ones
    data = ["Missing_hole", "Mouse_bite", "Open_circuit", "Short", "Spur", "Spurious_copper"]
    table = class_table(list(CLASS_NAMES), data)
    assert {CLASS_NAMES[s]: data[d] for s, d in table.items()} == {
        "open": "Open_circuit", "short": "Short", "mousebite": "Mouse_bite", "spur": "Spur",
        "copper": "Spurious_copper", "missing-hole": "Missing_hole",
    }  # fmt: skip
    assert normalised("Pin Hole") == normalised("pin-hole") == normalised("pin_holes")
    assert class_table(list(CLASS_NAMES), ["scratch", "crack"]) == {}


def test_boards_are_drawn_once_and_reused(board_cache) -> None:
    first = draw_boards(2, seed=7, color=False, template=False, size=480)
    images = sorted((first.parent / "images" / "train").iterdir())
    assert len(images) == 2 and first.parent.parent == board_cache / "synthetic_boards"
    stamps = [path.stat().st_mtime_ns for path in images]
    again = draw_boards(2, seed=7, color=False, template=False, size=480)
    assert again == first and [path.stat().st_mtime_ns for path in images] == stamps  # not redrawn
    assert not list(first.parent.parent.glob(".*.tmp"))  # no scratch folder left behind
    (first.parent / "stamp.json").write_text("{garbled")  # a broken set is drawn again, not trusted
    assert draw_boards(2, seed=7, color=False, template=False, size=480) == first
    assert json.loads((first.parent / "stamp.json").read_text())["boards"] == 2
    pairs = draw_boards(2, seed=7, color=True, template=True, size=480)
    assert pairs != first and load_dataset(pairs, "train").has_templates


def test_synthetic_boards_join_the_training_split(tmp_path, small_train_config) -> None:
    data_yaml = synthesize_dataset(
        tmp_path / "pcb", boards=6, seed=0, min_size=160, max_size=200, progress=False
    )
    # the line's data names its classes its own way and has no missing-hole class
    config = yaml.safe_load(data_yaml.read_text())
    names = ["Open_circuit", "Short", "Mouse_bite", "Spur", "Spurious_copper", "Pin_hole", "other"]
    config["names"] = names
    data_yaml.write_text(yaml.safe_dump(config))
    plain = build_train_data(small_train_config(tmp_path / "run0", data=data_yaml, template=False))
    mixed = build_train_data(
        small_train_config(tmp_path / "run1", data=data_yaml, template=False, synthetic_boards=3)
    )
    extra = [s for s in mixed.train.split.samples if s.image_id.startswith("synthetic/")]
    assert len(mixed.train.split.samples) == len(plain.train.split.samples) + 3 == len(mixed.train)
    assert len(extra) == 3 and all(s.template_path is None for s in extra)
    kept = np.concatenate([s.classes for s in extra])
    assert len(kept) > 0 and set(kept.tolist()) <= {0, 1, 2, 3, 4, 5}  # never "other", never missing-hole
    drawn = load_dataset(extra[0].image_path.parents[2] / "data.yaml", "train")
    missing = CLASS_NAMES.index("missing-hole")
    assert len(kept) == sum(int((s.classes != missing).sum()) for s in drawn.samples)
    row = {c.name: c for c in mixed.choices}["synthetic_boards"]
    assert row.value == 3 and row.source == "user" and "missing-hole dropped" in row.reason
    unset = {c.name: c for c in plain.choices}["synthetic_boards"]  # the row says what the option is for
    assert unset.value == 0 and "--synthetic-boards 50`" in unset.reason and "benchmarks" in unset.reason
    assert "Open_circuit, Short, Mouse_bite, Spur, Spurious_copper, Pin_hole" in unset.reason


@pytest.mark.parametrize("template", [False, True])
def test_design_mode_trains_each_boards_golden_template_as_defect_free(
    tmp_path, small_train_config, template
) -> None:
    data_yaml = synthesize_dataset(
        tmp_path / "pcb", boards=4, seed=3, min_size=160, max_size=200, progress=False
    )
    runs = {
        mode: build_train_data(
            small_train_config(
                tmp_path / mode, data=data_yaml, template=template, synthetic_boards=2,
                synthetic_boards_mode=mode,
            )
        )
        for mode in ("defects", "design", "both")
    }  # fmt: skip
    extra = {
        mode: [s for s in run.train.split.samples if s.image_id.startswith("synthetic/")]
        for mode, run in runs.items()
    }
    assert [len(extra[mode]) for mode in ("defects", "design", "both")] == [2, 2, 4]
    for design in extra["design"]:
        assert len(design.boxes) == 0 and design.image_path.parent.parent.name == "templates"
        assert design.template_path == (design.image_path if template else None)
    # a design is the damaged board's own golden template: same layout, the defects' pixels differ
    damaged = extra["both"][0]
    assert len(damaged.boxes) > 0 and damaged.image_path.parent.parent.name == "images"
    assert extra["both"][1].image_path.name == damaged.image_path.name
    assert (
        "defect-free board designs" in {c.name: c for c in runs["design"].choices}["synthetic_boards"].reason
    )


def test_a_short_budget_is_told_the_boards_cost(tmp_path, small_train_config, caplog) -> None:
    """Measured: at 10 minutes the boards cost DeepPCB accuracy, from 20 they paid; row and warning say so."""
    data_yaml = synthesize_dataset(
        tmp_path / "pcb", boards=3, seed=2, min_size=160, max_size=200, progress=False
    )
    short = small_train_config(tmp_path / "run0", data=data_yaml, template=False, time_minutes=10)
    unset = {c.name: c for c in build_train_data(short).choices}["synthetic_boards"]
    assert "10-minute budget is too short" in unset.reason and "--synthetic-boards" not in unset.reason
    assert "lowered held-out mAP@0.5 at 10 minutes" in unset.reason
    longer = small_train_config(tmp_path / "run1", data=data_yaml, template=False, time_minutes=30)
    assert (
        "try `--synthetic-boards"
        in {c.name: c for c in build_train_data(longer).choices}["synthetic_boards"].reason
    )
    with caplog.at_level(logging.WARNING, logger="defectdet"):
        build_train_data(
            small_train_config(
                tmp_path / "run2", data=data_yaml, template=False, time_minutes=10, synthetic_boards=2
            )
        )
    assert "a 10-minute budget" in caplog.text and "lowered held-out mAP@0.5 at 10 minutes" in caplog.text


def test_synthetic_boards_follow_the_template_mode(tmp_path, small_train_config, caplog) -> None:
    data_yaml = synthesize_dataset(
        tmp_path / "pcb", boards=4, seed=1, min_size=160, max_size=200, progress=False
    )
    with caplog.at_level(logging.WARNING, logger="defectdet"):  # measured to cost a template model accuracy
        data = build_train_data(small_train_config(tmp_path / "run", data=data_yaml, synthetic_boards=2))
    assert "for runs without templates" in caplog.text and "lowered DeepPCB held-out" in caplog.text
    assert data.template is True
    extra = [s for s in data.train.split.samples if s.image_id.startswith("synthetic/")]
    assert len(extra) == 2 and all(s.template_path is not None and s.template_path.is_file() for s in extra)


def test_data_without_a_board_class_is_refused(tmp_path, small_train_config, caplog) -> None:
    data_yaml = synthesize_dataset(
        tmp_path / "steel", boards=3, seed=0, kind="surface", min_size=128, max_size=160, progress=False
    )
    with caplog.at_level(logging.WARNING, logger="defectdet"):  # surfaces share one name: a warning says so
        data = build_train_data(small_train_config(tmp_path / "run0", data=data_yaml, synthetic_boards=2))
    assert "only 'pin-hole' matches" in caplog.text
    assert (
        "boxes of open, short, mousebite, spur, copper, missing-hole dropped"
        in {c.name: c for c in data.choices}["synthetic_boards"].reason
    )
    config = yaml.safe_load(data_yaml.read_text())  # a steel line naming its pin-holes "pits"
    config["names"] = ["pit" if name == "pin-hole" else name for name in config["names"]]
    data_yaml.write_text(yaml.safe_dump(config))
    unset = {
        c.name: c for c in build_train_data(small_train_config(tmp_path / "run1", data=data_yaml)).choices
    }
    assert "fit PCB data" in unset["synthetic_boards"].reason  # no suggestion for a surface line
    with pytest.raises(ConfigError, match="synthetic_boards.*share no name.*pit, scratch"):
        build_train_data(small_train_config(tmp_path / "run", data=data_yaml, synthetic_boards=2))


def test_suggested_count_is_about_half_the_images() -> None:
    assert [suggested_count(n) for n in (10, 200, 789, 4000)] == [50, 100, 400, 2000]


def test_a_resumed_run_keeps_its_synthetic_boards_and_clean_images(small_train_config, tmp_path) -> None:
    config = small_train_config(tmp_path / "run")
    assert _resumed_start(config, {"synthetic_boards": 400}).synthetic_boards == 400
    assert (
        _resumed_start(
            config.model_copy(update={"synthetic_boards": 5}), {"synthetic_boards": 400}
        ).synthetic_boards
        == 5
    )
    assert _resumed_start(config, {}).synthetic_boards == 0
    resumed = _resumed_start(config, {"synthetic_boards": 400, "synthetic_boards_mode": "design"})
    assert (resumed.synthetic_boards, resumed.synthetic_boards_mode) == (
        400,
        "design",
    )  # the same split again
    # the clean images of the run too: without them the split, and so the loader order, would change
    assert _resumed_start(config, {"clean_images": "good"}).clean_images == Path("good")
    assert _resumed_start(
        config.model_copy(update={"clean_images": Path("x")}), {"clean_images": "good"}
    ).clean_images == Path("x")


def test_train_cli_passes_synthetic_boards(tmp_path) -> None:
    data_yaml = synthesize_dataset(
        tmp_path / "pcb", boards=4, seed=2, min_size=160, max_size=200, progress=False
    )
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        ["train", str(data_yaml), "--no-template", "--synthetic-boards", "2", "--set", "max_steps=1",
         "--epochs", "1", "--batch", "2", "--workers", "0", "--out", str(out), "--from-scratch"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "synthetic_boards" in result.output
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["synthetic_boards"] == 2
