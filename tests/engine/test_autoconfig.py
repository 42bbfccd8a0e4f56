"""Settings chosen from the data: the rules on small synthetic statistics, overrides, stats from files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from defectdet.data.sample import DatasetSplit, Sample
from defectdet.engine.autoconfig import (
    SplitStats,
    add_clean_templates,
    balance_split,
    choices_table,
    choose_settings,
    collect_split_stats,
    model_overrides,
    repeat_factors,
)
from defectdet.engine.config import TrainConfig, config_from_dict
from defectdet.errors import ConfigError


def make_stats(
    image_size: tuple[int, int],
    box_sides: list[tuple[float, float]],
    images: int = 50,
    class_images: list[int] | None = None,
    with_template: int = 0,
    color: tuple[int, int] = (10, 0),
) -> SplitStats:
    width, height = image_size
    counts = np.array(class_images or [images, images], np.int64)
    return SplitStats(
        images=images,
        sizes=np.tile(np.array([[width, height]], np.float32), (images, 1)),
        box_wh=np.array(box_sides, np.float32),
        box_image_long=np.full(len(box_sides), max(width, height), np.float32),
        class_names=[f"c{i}" for i in range(len(counts))],
        class_boxes=counts,
        class_images=counts,
        with_template=with_template,
        color_checked=color[0],
        color_images=color[1],
    )


def chosen(stats: SplitStats, **fields) -> tuple[TrainConfig, dict]:
    config, choices = choose_settings(stats, TrainConfig(**fields))
    return config, {choice.name: choice for choice in choices}


def test_tiny_defects_in_big_images_get_high_resolution_and_crops() -> None:
    rng = np.random.default_rng(0)
    stats = make_stats((2048, 1536), [(s, s) for s in rng.uniform(6, 16, 200)])
    config, why = chosen(stats)
    assert config.input_size > 640 and config.input_size % 32 == 0
    assert config.crop_size and config.crop_size >= 320 and config.crop_size <= config.input_size // 2
    assert config.strides == [8, 16]  # no large boxes: no coarse level
    assert why["input_size"].source == "auto" and "capped" in why["input_size"].reason


def test_large_defects_in_small_images_get_native_size_no_crops_and_a_coarse_level() -> None:
    rng = np.random.default_rng(1)
    stats = make_stats((200, 200), [(w, h) for w, h in rng.uniform(60, 195, (100, 2))])
    config, why = chosen(stats)
    assert config.input_size == 192  # the 200 px images are not upsampled to 640
    assert config.crop_size == 0
    assert config.strides == [8, 16, 32]
    assert "upsample 3.2x" in why["input_size"].reason and "stride-32" in why["strides"].reason


def test_deeppcb_like_data_keeps_640_with_320_crops() -> None:
    rng = np.random.default_rng(2)
    stats = make_stats((640, 640), [(w, h) for w, h in rng.uniform(18, 60, (300, 2))], with_template=50)
    config, _ = chosen(stats)
    assert (config.input_size, config.crop_size, config.strides, config.template) == (640, 320, [8, 16], True)
    assert config.batch == 16  # the recipe that reached 0.96+ on DeepPCB


def test_large_images_with_large_defects_are_downscaled_for_whole_image_training() -> None:
    stats = make_stats((2048, 2048), [(400, 300)] * 20 + [(900, 700)] * 20)
    config, why = chosen(stats)
    # whole images: below 640 down to the floor, the smallest defects still span 54 px there
    assert config.input_size == 320 and config.crop_size == 0 and 32 in config.strides
    assert config.batch == 8  # 320 px whole images without templates: lite0, half the recipe's pixels
    assert chosen(stats, preset="tiny")[0].batch == 16  # the recipe's batch for our own backbones
    assert (
        "lowered to 320" in why["input_size"].reason
        and "4.0x the images per second" in why["input_size"].reason
    )


def test_whole_image_shrink_keeps_the_typical_defect_and_reports_what_it_loses() -> None:
    # surface-like: 500 px images, a few pin-holes, most defects 40-200 px
    rng = np.random.default_rng(3)
    sides = [(s, s) for s in rng.uniform(5, 10, 15)] + [(s, s) for s in rng.uniform(40, 200, 85)]
    config, why = chosen(make_stats((500, 480), sides))
    assert config.crop_size == 0 and 320 <= config.input_size < 512 and config.input_size % 32 == 0
    assert float(np.percentile([s for s, _ in sides], 25)) * config.input_size / 500 >= 32
    assert "15% of defects are under 12 px there" in why["input_size"].reason
    # a user's crop of 0 with an auto letterbox shrinks too; a user's letterbox is kept
    assert chosen(make_stats((500, 480), sides), crop_size=0)[0].input_size == config.input_size
    assert chosen(make_stats((500, 480), sides), input_size=512)[0].input_size == 512


def test_tiles_go_on_only_where_the_letterbox_loses_small_defects_of_large_images() -> None:
    # pin-holes in 2,000 px plates letterboxed to 352: under 2 px there, so inference adds tiles
    pin_holes = make_stats((2000, 1500), [(8, 8)] * 20 + [(400, 300)] * 80)
    config, why = chosen(pin_holes, input_size=352)
    assert config.tiles is True and why["tiles"].source == "auto"
    assert "20% of defects are under 12 px at 352" in why["tiles"].reason
    # the same plates with only large defects: whole images are enough
    large = make_stats((2000, 1500), [(400, 300)] * 100)
    assert chosen(large, input_size=352)[0].tiles is False
    # DeepPCB-like: the images are the letterbox, nothing to tile
    rng = np.random.default_rng(2)
    deeppcb = make_stats((640, 640), [(w, h) for w, h in rng.uniform(18, 60, (300, 2))], with_template=50)
    config, why = chosen(deeppcb)
    assert config.tiles is False and "no image is over 1.5x" in why["tiles"].reason
    # a user's choice wins and says what the data suggested
    config, why = chosen(pin_holes, input_size=352, tiles=False)
    assert (
        config.tiles is False
        and why["tiles"].source == "user"
        and "from the data: True" in why["tiles"].reason
    )


def test_user_values_win_and_are_reported_with_the_data_suggestion() -> None:
    stats = make_stats((200, 200), [(150, 150)] * 10)
    config, why = chosen(stats, input_size=640, crop_size=320, strides=[8], channels=3, template=False)
    assert (config.input_size, config.crop_size, config.strides, config.channels) == (640, 320, [8], 3)
    assert why["input_size"].source == "user" and "from the data: 192" in why["input_size"].reason
    assert why["crop_size"].source == "user" and "0 (off)" in why["crop_size"].reason


def test_resumed_checkpoint_values_win_over_the_data() -> None:
    stats = make_stats((200, 200), [(150, 150)] * 10)
    previous = {"imgsz": 320, "crop_size": 0, "strides": [8, 16], "channels": 1, "template": False}
    config, choices = choose_settings(stats, TrainConfig(), previous)
    assert (config.input_size, config.strides) == (320, [8, 16])
    assert {c.source for c in choices if c.name in previous} == {"checkpoint"}


def test_channels_template_and_class_balance() -> None:
    boxes = [(30, 30)] * 5
    assert chosen(make_stats((640, 480), boxes, color=(12, 6)))[0].channels == 3
    assert chosen(make_stats((640, 480), boxes, color=(12, 1)))[0].channels == 1
    config, why = chosen(make_stats((640, 480), boxes, images=10, with_template=4))
    assert config.template is False and "4 of 10" in why["template"].reason
    config, why = chosen(make_stats((640, 480), boxes, class_images=[100, 10, 0]))
    assert config.class_balance == "repeat" and "c1 in 10 images" in why["class_balance"].reason
    assert "no training image of c2" in why["class_balance"].reason
    assert chosen(make_stats((640, 480), boxes, class_images=[100, 60]))[0].class_balance == "off"


def test_preset_is_nano_with_templates_lite0_without_and_follows_the_template_setting(monkeypatch) -> None:
    from defectdet.model import imagenet

    boxes = [(30, 30)] * 5
    paired = make_stats((640, 640), boxes, images=10, with_template=10)
    config, why = chosen(paired)
    assert (config.template, config.preset, why["preset"].source) == (True, "nano", "auto")
    assert config.backbone_lr_scale == 1.0 and config.batch == 16
    config, why = chosen(paired, template=False)  # the user drops the templates: the image alone
    assert (
        config.preset == "lite0"
        and "no templates" in why["preset"].reason
        and "ImageNet" in why["preset"].reason
    )
    # ImageNet features: the backbone learns slower than the new head, and the step's pixels are halved
    assert config.pretrained is True and config.backbone_lr_scale == 0.25 and config.batch == 8
    assert config.frozen_stem is True and "strides 2 and 4" in why["frozen_stem"].reason
    assert model_overrides(config)["frozen_stem"] is True
    assert chosen(paired)[0].frozen_stem is False  # with templates: nano, nothing to freeze
    assert "ImageNet" in why["pretrained"].reason and "0.25" in why["backbone_lr_scale"].reason
    assert chosen(make_stats((640, 480), boxes))[0].preset == "lite0"
    config, why = chosen(paired, template=False, pretrained=False)  # --from-scratch: full lr everywhere
    assert config.preset == "lite0" and config.backbone_lr_scale == 1.0 and config.frozen_stem is False
    monkeypatch.setattr(imagenet, "weights_path", lambda: None)  # the weights package is not installed
    config, why = chosen(paired, template=False)
    assert config.preset == "tiny" and config.backbone_lr_scale == 1.0
    config, why = chosen(paired, preset="small")
    assert config.preset == "small" and why["preset"].source == "user" and "nano" in why["preset"].reason
    assert config.strides == [8, 16, 32]  # the strides follow the preset that was chosen
    config, choices = choose_settings(paired, TrainConfig(), {"preset": "tiny", "template": True})
    assert config.preset == "tiny" and [c.source for c in choices if c.name == "preset"] == ["checkpoint"]
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        chosen(paired, preset="huge")


def test_clean_templates_only_for_a_model_without_templates_on_paired_data() -> None:
    boxes = [(30, 30)] * 5
    config, why = chosen(make_stats((640, 480), boxes, images=10, with_template=10), template=False)
    assert config.clean_templates is False and "has 10 templates" in why["clean_templates"].reason
    config, why = chosen(
        make_stats((640, 480), boxes, images=10, with_template=10), template=False, clean_templates=True
    )
    assert config.clean_templates is True and why["clean_templates"].source == "user"
    assert chosen(make_stats((640, 480), boxes, images=10, with_template=10))[0].clean_templates is False
    assert chosen(make_stats((640, 480), boxes, images=10))[0].clean_templates is False
    config, why = chosen(make_stats((640, 480), boxes, images=10, with_template=10), clean_templates=False)
    assert config.clean_templates is False and why["clean_templates"].source == "user"

    shared = Path("golden.png")  # two tested images of one board share its template: it is added once
    samples = [
        Sample(Path("a.png"), [[0, 0, 5, 5]], [1], template_path=shared),
        Sample(Path("b.png"), [[1, 1, 6, 6]], [0], template_path=shared),
        Sample(Path("c.png"), [[2, 2, 7, 7]], [0], template_path=Path("other.png")),
        Sample(Path("d.png"), [], []),
    ]
    split = add_clean_templates(DatasetSplit(samples, ["x", "y"], "deeppcb", "train", Path(".")))
    assert split.samples[:4] == samples
    added = split.samples[4:]
    assert [s.image_path for s in added] == [shared, Path("other.png")]
    assert all(len(s.boxes) == 0 and len(s.classes) == 0 and s.template_path is None for s in added)
    assert [s.image_id for s in added] == ["a_template", "c_template"]


def test_repeat_factors_oversample_rare_classes() -> None:
    samples = [Sample(Path(f"{i}.png"), [[0, 0, 5, 5]], [0]) for i in range(90)]
    samples += [Sample(Path(f"r{i}.png"), [[0, 0, 5, 5]], [1]) for i in range(10)]
    split = DatasetSplit(samples, ["common", "rare"], "yolo", "train", Path("."))
    repeats = repeat_factors(split, seed=0)
    assert (repeats[:90] == 1).all() and (repeats[90:] == 3).all()  # sqrt(90 / 10)
    assert len(balance_split(split).samples) == 90 + 30


def test_table_and_model_overrides() -> None:
    config, choices = choose_settings(make_stats((200, 200), [(150, 150)] * 10), TrainConfig())
    console = Console(record=True, width=200)
    console.print(choices_table(choices))
    text = console.export_text()
    labels = (
        "input size (px) (--input-size)",
        "training crops (px) (--crop)",  # the option's own flag
        "colour channels (--channels)",
        "golden template (--template)",
        "rare classes shown more (--set class_balance=...)",  # no option of its own
    )
    for label in labels:
        assert label in text
    assert "regression ranges" not in text and "softplus" not in text  # a design fact, not a setting
    assert model_overrides(config) == {"levels": (0, 1, 2), "frozen_stem": True}  # lite0 from ImageNet
    assert model_overrides(TrainConfig()) == {}


def test_config_rejects_sizes_the_model_cannot_take() -> None:
    with pytest.raises(ConfigError, match="input_size"):
        config_from_dict({"input_size": 200})
    with pytest.raises(ConfigError, match="crop_size"):
        config_from_dict({"crop_size": 100})
    assert config_from_dict({"crop_size": 0, "strides": [32, 8]}).strides == [8, 32]


def test_collect_split_stats_reads_headers_and_colour(tmp_path) -> None:
    from defectdet.data.formats import load_dataset
    from defectdet.data.synth import synthesize_dataset

    for color, channels in ((True, 3), (False, 1)):
        data_yaml = synthesize_dataset(
            tmp_path / str(color), boards=6, seed=1, kind="surface", max_size=256, color=color, progress=False
        )
        split = load_dataset(data_yaml, "train")
        stats = collect_split_stats(split)
        assert stats.images == len(split.samples) and len(stats.sizes) == len(split.samples)
        assert stats.sizes.max() <= 256 and stats.with_template == 0
        assert len(stats.box_wh) == sum(len(sample.boxes) for sample in split.samples)
        assert choose_settings(stats, TrainConfig())[0].channels == channels


def test_without_templates_the_time_budget_and_the_measured_step_decide_between_lite0_and_tiny() -> None:
    from defectdet.engine.step_speed import StepShape, measure_step_seconds

    stats = make_stats((640, 640), [(30, 30)] * 20)
    shapes: list[StepShape] = []

    def timer(seconds: float):
        def step_seconds(shape: StepShape) -> float:
            shapes.append(shape)
            return seconds

        return step_seconds

    config, choices = choose_settings(stats, TrainConfig(time_minutes=10), None, timer(1.0))  # 600 steps
    why = {choice.name: choice for choice in choices}
    assert config.preset == "tiny" and "about 600 steps" in why["preset"].reason
    assert shapes[-1] == StepShape("lite0", 1, False, 0, 320, 8, True)  # the run's crops, batch, frozen stem
    config, choices = choose_settings(stats, TrainConfig(time_minutes=10), None, timer(0.02))  # 30000 steps
    assert (
        config.preset == "lite0"
        and "about 30000 steps" in [c for c in choices if c.name == "preset"][0].reason
    )

    # no time budget: the step itself decides (a CPU's step is too slow to run epochs of lite0 by default)
    config, choices = choose_settings(stats, TrainConfig(epochs=5), None, timer(0.8))
    assert (
        config.preset == "tiny" and "no time budget" in [c for c in choices if c.name == "preset"][0].reason
    )
    assert choose_settings(stats, TrainConfig(epochs=5), None, timer(0.05))[0].preset == "lite0"

    def never(shape: StepShape) -> float:
        raise AssertionError("nothing to weigh: a preset given, or templates")

    assert (
        choose_settings(stats, TrainConfig(time_minutes=1, preset="lite0"), None, never)[0].preset == "lite0"
    )
    paired = make_stats((640, 640), [(30, 30)] * 20, with_template=50)
    assert choose_settings(paired, TrainConfig(time_minutes=1), None, never)[0].preset == "nano"
    seconds = measure_step_seconds(StepShape("lite0", 1, False, 1, 64, 2))  # a real step, companions too
    assert 0 < seconds < 30


def test_a_step_shape_is_timed_once_per_process(monkeypatch) -> None:
    from defectdet.engine import step_speed

    calls: list[step_speed.StepShape] = []

    def measure(shape: step_speed.StepShape, device: str = "cpu") -> float:
        calls.append(shape)
        return 0.5

    monkeypatch.setattr(step_speed, "measure_step_seconds", measure)
    step_speed._cached_step_seconds.cache_clear()
    shape = step_speed.StepShape("lite0", 1, False, 0, 96, 2, True)
    assert step_speed.step_seconds_here(shape) == step_speed.step_seconds_here(shape) == 0.5
    assert calls == [shape]
    step_speed.step_seconds_here(step_speed.StepShape("lite0", 3, False, 0, 96, 2, True))  # another shape
    assert len(calls) == 2
    step_speed._cached_step_seconds.cache_clear()
