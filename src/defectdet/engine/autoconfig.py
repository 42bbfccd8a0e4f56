"""Training settings chosen from the data: `choose_settings(stats, config) -> (config, choices)`.

`TrainConfig` fields left at None mean "choose from the data": letterbox size (`input_size`), crops
(`crop_size`, 0 = none), head strides (`strides`), gray or colour (`channels`), template or not
(`template`) and class balancing (`class_balance`). A value the user gave is kept and reported as
such (with what the data would have suggested when it differs); on resume the checkpoint's values
are kept so the model rebuilds exactly.

The statistics come from label files and image headers (`collect_split_stats`): image sizes and
box sizes of up to `max_images` sampled images, class counts over all of them, and a decode of a
dozen colour-coded files to tell colour content from gray stored as RGB.

Rules (pixels are at the letterbox size S; `MIN_DEFECT_PX`, `CROP_BASE`, `LARGE_BOX_PX` below):
- input_size: the median long image side rounded to 32 ("native", never an upsampling default),
  lowered towards 640 when 90% of defects stay >= MIN_DEFECT_PX there, capped at MAX_AUTO_INPUT_SIZE.
  With whole-image training (no crops) every pixel is paid for at every step, so the letterbox is
  lowered further, not below WHOLE_IMAGE_FLOOR, while the 25th-percentile defect keeps
  TYPICAL_DEFECT_PX: on a CPU time budget the epochs bought are worth more than resolution the
  defects do not need (bench/results/train_surface_*.json). With crops the crop bounds that cost.
- crop_size: crops only when S >= 2 x CROP_BASE and the crop (>= CROP_BASE and >= twice the
  95th-percentile defect) fits in half of S; otherwise whole images.
- preset: nano with templates (the fastest; the comparison does most of the work), tiny without (from its
  shipped weights it led nano at every CPU budget measured without templates: bench/results/scaling.json,
  bench/results/preset_modes_5min.json).
- strides: the preset's; plus 32 when >= 10% of defects reach LARGE_BOX_PX.
- channels: 3 when >= 20% of checked colour-coded images have colour content, else 1.
- template: when every training image has one.
- companions: every companion capture (another lighting, focus or band) that every training image has, in the
  dataset's declared order; each becomes extra input planes after the tested image (and template).
- batch: 16 images of 320 x 320 per step (DeepPCB's recipe) kept as a pixel budget: fewer, larger
  images per step for whole-image training, so a time budget still gets many optimizer steps.
- class_balance: 'repeat' (rare-class images repeated, `repeat_factors`) when the most and least
  frequent classes differ by >= BALANCE_RATIO in images containing them.
- pretrained: start from the package's shipped weights (`model.pretrained`) when they exist for the
  preset and the input layout (template or not); `--from-scratch` starts from random weights.
- clean_templates: off. When on, a run without templates on data that has them (DeepPCB trained
  `--no-template`) also trains on each golden template as a defect-free image; on DeepPCB that cost accuracy
  in a 10-minute budget (half the steps see no defect), so it is the user's choice.
- clean_images: never chosen from the data; a folder the user names (`train --clean-images DIR`): defect-free
  images of the line (a new board design's golden images) that train as images without defects.
- synthetic_boards: never chosen from the data; a count the user names (`train --synthetic-boards N`): synthetic
  PCB boards drawn into the training split (`engine.synthetic_boards`), for PCB lines without templates.
- tiles: on when >= TILE_SHARE of defects are under MIN_DEFECT_PX at S and lie in images the letterbox
  shrinks by more than `data.tiling.TILE_TRIGGER`: inference then also runs native-resolution tiles of
  those images (`data.tiling`), whose small detections join the whole-image ones.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from defectdet.compat import Surface, current_keys
from defectdet.data.letterbox import DEFAULT_INPUT_SIZE
from defectdet.data.sample import DatasetSplit, Sample
from defectdet.engine.config import TrainConfig
from defectdet.engine.step_speed import StepShape
from defectdet.errors import ConfigError, ImageReadError

logger = logging.getLogger(__name__)

MAX_AUTO_INPUT_SIZE = 1280  # the CPU budget: larger letterboxes make validation and decode slow
MIN_AUTO_INPUT_SIZE = 64
MIN_DEFECT_PX = 12  # a defect smaller than ~1.5 stride-8 cells at the input is hard to find
TYPICAL_DEFECT_PX = 32  # the 25th-percentile defect keeps ~4 stride-8 cells when whole images shrink
WHOLE_IMAGE_FLOOR = 320  # whole-image letterboxes are not shrunk below this (DeepPCB's training crop)
CROP_BASE = 320  # the crop that worked on DeepPCB 640 (bench/results/train_deeppcb_*)
LARGE_BOX_PX = 128  # >= 4 stride-32 cells: big enough to want a coarse level
LARGE_SHARE = 0.10
COLOR_SPREAD = 3.0  # mean |R-G|, |G-B|, |R-B| in gray levels above which an image has colour
COLOR_SHARE = 0.2
BALANCE_RATIO = 4.0
MAX_REPEAT = 4.0
TILE_SHARE = 0.05  # tiles when this share of defects is under MIN_DEFECT_PX in images the letterbox shrinks
SETTING_NAMES = (
    "preset",
    "input_size",
    "crop_size",
    "strides",
    "batch",
    "channels",
    "template",
    "companions",
    "class_balance",
    "tiles",
    "clean_templates",
    "pretrained",
    "backbone_lr_scale",
    "frozen_stem",
)
BASE_BATCH = 16  # images per step at CROP_BASE x CROP_BASE
IMAGENET_BACKBONE_LR_SCALE = 0.25
# lite0 is chosen for a time budget only when it buys this many steps (engine.step_speed measures one). On the
# real-data benchmark lite0 learned more per step than tiny (about twice on AGDD) but each of its steps cost
# several of tiny's on a 2-core CPU (bench/results/step_speed.json), and tiny led at every CPU budget measured;
# this many steps takes hours on such a CPU and minutes on a GPU, where tiny has long stopped gaining
LITE0_MIN_STEPS = 20000
LITE0_MAX_STEP_SECONDS = 0.1  # without a time budget: lite0 when its step is this fast (a GPU's, not a CPU's)
MIN_AUTO_BATCH = 4  # BatchNorm statistics get noisy below this
ALL_STRIDES = (8, 16, 32)
GRAY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F"})

Source = Literal["auto", "user", "checkpoint", "fixed", "model"]  # model: fixed by `train --from`


@dataclass(frozen=True)
class Choice:
    """One setting: its value, why, and who decided (auto / user / checkpoint / fixed / model)."""

    name: str
    value: Any
    reason: str
    source: Source = "auto"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SplitStats:
    """What the settings are chosen from. Sizes are original pixels."""

    images: int  # samples in the split
    sizes: np.ndarray  # (S, 2) width, height of the sampled images
    box_wh: np.ndarray  # (M, 2) width, height of the boxes of the sampled images
    box_image_long: np.ndarray  # (M,) long side of each box's image
    class_names: list[str]
    class_boxes: np.ndarray  # (K,) boxes per class, all samples
    class_images: np.ndarray  # (K,) images containing the class, all samples
    with_template: int  # samples that have a template
    companion_names: list[str] = field(default_factory=list)  # declared by the dataset, in its order
    with_companion: dict[str, int] = field(default_factory=dict)  # samples that have each companion
    color_checked: int = 0  # sampled files checked for colour
    color_images: int = 0  # of those, with colour content
    notes: list[str] = field(default_factory=list)

    @property
    def median_long_side(self) -> float | None:
        return float(np.median(self.sizes.max(1))) if len(self.sizes) else None

    def box_long_at(self, input_size: int) -> np.ndarray:
        """(M,) long side of each box after letterboxing its image to `input_size`."""
        return self.box_wh.max(1) * input_size / np.maximum(self.box_image_long, 1)

    def box_size_at(self, input_size: int) -> np.ndarray:
        """(M,) sqrt(area) of each box after letterboxing to `input_size` (a thin scratch counts by area)."""
        return np.sqrt(self.box_wh.prod(1)) * input_size / np.maximum(self.box_image_long, 1)


def collect_split_stats(
    split: DatasetSplit, max_images: int = 500, color_samples: int = 12, seed: int = 0
) -> SplitStats:
    """Image/box sizes of up to `max_images` samples (headers only), class counts of all samples,
    and whether `color_samples` of them have colour (gray files by header; RGB files decoded)."""
    samples = split.samples
    order = np.random.default_rng(seed).permutation(len(samples))[:max_images]
    sizes, box_wh, box_long = [], [], []
    color_checked = color_images = 0
    unreadable = 0
    for index in order.tolist():
        sample = samples[index]
        size = _image_size(sample)
        if size is None:
            unreadable += 1
            continue
        sizes.append(size)
        if len(sample.boxes):
            wh = np.clip(sample.boxes[:, 2:] - sample.boxes[:, :2], 1.0, None)
            box_wh.append(wh)
            box_long.append(np.full(len(wh), max(size), np.float32))
        if color_checked < color_samples:
            color = _color_check(sample.image_path)
            if color is not None:
                color_checked += 1
                color_images += color
    class_boxes, class_images = _class_counts(samples, len(split.class_names))
    notes = [f"{unreadable} sampled images unreadable (skipped)"] if unreadable else []
    return SplitStats(
        images=len(samples),
        sizes=np.array(sizes, np.float32).reshape(-1, 2),
        box_wh=np.concatenate(box_wh).astype(np.float32) if box_wh else np.zeros((0, 2), np.float32),
        box_image_long=np.concatenate(box_long) if box_long else np.zeros(0, np.float32),
        class_names=list(split.class_names),
        class_boxes=class_boxes,
        class_images=class_images,
        with_template=sum(sample.template_path is not None for sample in samples),
        companion_names=list(split.companion_names),
        with_companion={
            name: sum(name in sample.companion_paths for sample in samples) for name in split.companion_names
        },
        color_checked=color_checked,
        color_images=color_images,
        notes=notes,
    )


def _image_size(sample: Sample) -> tuple[int, int] | None:
    """(width, height) of a sample: from its labels when they give it, else its file's header; None unreadable."""
    from defectdet.data.imageio import read_image_size

    if sample.width and sample.height:
        return sample.width, sample.height
    try:
        return read_image_size(sample.image_path)
    except ImageReadError:
        return None


def _color_check(path: Path) -> int | None:
    """1 when the image has colour content, 0 when it is gray (by its header, or decoded when it is stored as
    colour; 0 too when that decode fails), None when its header cannot be read (not checked)."""
    from PIL import Image

    from defectdet.data.imageio import read_image

    try:
        with Image.open(path) as image:
            gray = image.mode in GRAY_MODES
    except (OSError, ValueError, ImageReadError):
        return None
    if gray:
        return 0
    try:  # a file stored as RGB may still be gray: decode it to look
        return int(color_spread(read_image(path, 3)) > COLOR_SPREAD)
    except (OSError, ValueError, ImageReadError):
        return 0


def _class_counts(samples: list[Sample], num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(K,) boxes per class and (K,) images containing each class, over `samples`."""
    class_boxes = np.zeros(num_classes, np.int64)
    class_images = np.zeros(num_classes, np.int64)
    for sample in samples:
        present = sample.classes[(sample.classes >= 0) & (sample.classes < num_classes)]
        np.add.at(class_boxes, present, 1)
        class_images[np.unique(present)] += 1
    return class_boxes, class_images


def color_spread(image: np.ndarray) -> float:
    """Mean absolute difference between the RGB channels of an (H, W, 3) image, on a subsample."""
    step = max(1, int(math.sqrt(image.shape[0] * image.shape[1] / 65536)))
    pixels = image[::step, ::step].astype(np.int16)
    r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    return float((np.abs(r - g).mean() + np.abs(g - b).mean() + np.abs(r - b).mean()) / 3)


def _round32(value: float, up: bool = False) -> int:
    return int(32 * (math.ceil(value / 32) if up else round(value / 32)))


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def auto_input_size(stats: SplitStats) -> tuple[int, str]:
    median = stats.median_long_side
    if median is None:
        return DEFAULT_INPUT_SIZE, "no readable image sizes: the default"
    native = max(MIN_AUTO_INPUT_SIZE, _round32(median))
    floor, ceiling = min(native, DEFAULT_INPUT_SIZE), min(native, MAX_AUTO_INPUT_SIZE)
    sizes = stats.box_size_at(1)  # relative to the image's long side
    if len(sizes) == 0:
        size = floor
        why = f"median long side {median:.0f} px, no boxes to size it by"
    else:
        needed = MIN_DEFECT_PX / max(_pct(sizes, 10), 1e-6)
        size = _round32(min(max(needed, floor), ceiling), up=True)
        small = _pct(stats.box_size_at(size), 10)
        if size < native:
            why = (
                f"median long side {median:.0f} px; at {size} the 10th-percentile defect is {small:.0f} px "
                f"(>= {MIN_DEFECT_PX} wanted)"
            )
            if needed > ceiling:
                why = f"{why[:-1]}, capped at {MAX_AUTO_INPUT_SIZE} for the CPU)"
        else:
            why = f"median long side {median:.0f} px kept (10th-percentile defect {small:.0f} px)"
    if size < DEFAULT_INPUT_SIZE and native == size:
        why += f"; {DEFAULT_INPUT_SIZE} would upsample {DEFAULT_INPUT_SIZE / median:.1f}x"
    upsampled = float(np.mean(stats.sizes.max(1) < 0.9 * size)) if len(stats.sizes) else 0.0
    if upsampled >= 0.05:
        why += f"; {upsampled:.0%} of images are upsampled"
    return size, why


def shrink_whole_images(stats: SplitStats, input_size: int) -> tuple[int, str]:
    """The letterbox for whole-image training: `input_size` lowered (not below WHOLE_IMAGE_FLOOR) to where
    the 25th-percentile defect (sqrt of its area) still spans TYPICAL_DEFECT_PX; "" when kept."""
    sizes = stats.box_size_at(1)
    if len(sizes) == 0:
        return input_size, ""
    quartile = _pct(sizes, 25)
    size = min(input_size, max(_round32(TYPICAL_DEFECT_PX / max(quartile, 1e-6), up=True), WHOLE_IMAGE_FLOOR))
    if size >= input_size:
        return input_size, ""
    lost = float(np.mean(stats.box_size_at(size) < MIN_DEFECT_PX))
    return size, (
        f"whole images pay for every pixel at every step: lowered to {size}, where the 25th-percentile "
        f"defect is still {quartile * size:.0f} px (>= {TYPICAL_DEFECT_PX} wanted), {(input_size / size) ** 2:.1f}x "
        f"the images per second of {input_size}; {lost:.0%} of defects are under {MIN_DEFECT_PX} px there"
    )


def auto_crop(stats: SplitStats, input_size: int) -> tuple[int, str]:
    if input_size < 2 * CROP_BASE:
        return 0, f"letterbox {input_size} < 2 x {CROP_BASE}: whole images"
    longs = stats.box_long_at(input_size)
    if len(longs) == 0:
        return CROP_BASE, f"no boxes; {CROP_BASE} crops of the {input_size} letterbox"
    p95 = _pct(longs, 95)
    crop = max(CROP_BASE, _round32(2 * p95, up=True))
    if crop > input_size // 2:
        return 0, (
            f"large defects (95th-percentile long side {p95:.0f} px at {input_size}) would be cut by crops "
            f"<= {input_size // 2}: whole images"
        )
    return crop, (
        f"defects are small (95% <= {p95:.0f} px at {input_size}): {crop} crops hold them whole, "
        f"{(input_size / crop) ** 2:.0f}x fewer pixels per image"
    )


def auto_preset(template: bool, lite0_step: tuple[int | None, float] | None = None) -> tuple[str, str]:
    """nano with templates; without them lite0 (ImageNet features) when its weights package is installed and the
    measured step allows it, else tiny. `lite0_step`: (steps the time budget buys, or None without a budget;
    measured seconds per lite0 step), None when not measured. With a budget lite0 needs `LITE0_MIN_STEPS`
    steps; without one (epochs) a step of at most `LITE0_MAX_STEP_SECONDS`, as on a GPU."""
    if template:
        return "nano", (
            "templates: the fastest preset; the comparison with the template does most of the work"
        )
    from defectdet.model.imagenet import weights_path

    if weights_path() is None:
        return "tiny", (
            "no templates: from its shipped weights tiny beat nano at every CPU budget measured on DeepPCB "
            "without templates and on the synthetic surfaces (see the accuracy benchmarks); lite0's ImageNet "
            "weights package is not installed"
        )
    steps, seconds = lite0_step or (None, None)
    why_not = (
        "it learns more per step, but tiny trains several times more steps per minute on a CPU and led at "
        "every CPU budget measured (see the real-data benchmark); --preset lite0 forces it, a GPU chooses it"
    )
    if steps is not None and steps < LITE0_MIN_STEPS:
        return "tiny", (
            f"no templates: lite0 (ImageNet features) would train about {steps} steps in this budget at the "
            f"measured {seconds:.2f} s per step, fewer than the {LITE0_MIN_STEPS} it is chosen for: {why_not}"
        )
    if steps is None and seconds is not None and seconds > LITE0_MAX_STEP_SECONDS:
        return "tiny", (
            f"no templates and no time budget: a lite0 (ImageNet features) step took {seconds:.2f} s here, "
            f"over the {LITE0_MAX_STEP_SECONDS:g} s it is chosen for without a budget: {why_not}"
        )
    measured = f"; about {steps} steps in this budget at {seconds:.2f} s per step" if steps else ""
    if seconds is not None and not steps:
        measured = f"; {seconds:.2f} s per step here"
    return "lite0", (
        f"no templates: the image alone must show the defect, and lite0 starts from features learned on "
        f"ImageNet's real images{measured}"
    )


def auto_strides(stats: SplitStats, input_size: int, preset: str) -> tuple[list[int], str]:
    from defectdet.model.detector import PRESETS, STRIDES_BY_LEVEL

    if preset not in PRESETS:
        raise ConfigError(f"field 'preset': unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    strides = [STRIDES_BY_LEVEL[level] for level in PRESETS[preset]["levels"]]
    longs = stats.box_long_at(input_size)
    share = float(np.mean(longs >= LARGE_BOX_PX)) if len(longs) else 0.0
    listed = ",".join(map(str, strides))
    if 32 not in strides and share >= LARGE_SHARE:
        return sorted({*strides, 32}), (
            f"{share:.0%} of defects are >= {LARGE_BOX_PX} px at {input_size} (90th pct {_pct(longs, 90):.0f} px): "
            f"adds a stride-32 level to the preset's {listed} for their size"
        )
    if 32 in strides:
        return strides, f"the {preset} preset already has a stride-32 level"
    return (
        strides,
        f"only {share:.0%} of defects are >= {LARGE_BOX_PX} px at {input_size}: the preset's {listed}",
    )


def auto_batch(input_size: int, preset: str = "tiny") -> tuple[int, str]:
    """The `BASE_BATCH` x `CROP_BASE`^2 pixel budget per step (half of it for lite0, whose step costs several of
    tiny's: a time budget still buys hundreds of steps)."""
    from defectdet.model.detector import has_imagenet_backbone

    heavy = has_imagenet_backbone(preset)
    base = BASE_BATCH // 2 if heavy else BASE_BATCH
    pixels = base * CROP_BASE**2
    batch = int(min(base, max(MIN_AUTO_BATCH, round(pixels / input_size**2))))
    note = f" (half the usual pixels: the {preset} preset's step costs several of tiny's)" if heavy else ""
    if batch == base:
        return batch, f"{input_size} px inputs: {batch} x {CROP_BASE}^2 px per step{note}"
    return batch, (
        f"{input_size} px inputs: {batch} per step keeps about {base} x {CROP_BASE}^2 px per step{note}, "
        f"so a time budget still gets many optimizer steps"
    )


def auto_channels(stats: SplitStats) -> tuple[int, str]:
    if stats.color_checked == 0:
        return 1, "no image could be checked for colour: gray"
    share = stats.color_images / stats.color_checked
    found = f"{stats.color_images} of {stats.color_checked} sampled images have colour content"
    if share >= COLOR_SHARE:
        return 3, f"{found}: RGB input"
    return 1, f"{found} (< {COLOR_SHARE:.0%}): gray input"


def auto_template(stats: SplitStats) -> tuple[bool, str]:
    if stats.images and stats.with_template == stats.images:
        return True, "every training image has a template: the model compares against it"
    if stats.with_template:
        return False, f"only {stats.with_template} of {stats.images} images have a template"
    return False, "the dataset has no templates"


def auto_companions(stats: SplitStats) -> tuple[list[str], str]:
    """Every companion every training image has, in the declared order; the others are named with their count."""
    if not stats.companion_names:
        return [], "the dataset has no companion captures"
    used = [
        name for name in stats.companion_names if stats.images and stats.with_companion[name] == stats.images
    ]
    partial = [
        f"{name} ({stats.with_companion[name]} of {stats.images} images)"
        for name in stats.companion_names
        if name not in used
    ]
    left = f"; left out, not every image has it: {', '.join(partial)}" if partial else ""
    if not used:
        return [], f"no companion is in every training image{left}"
    planes = "an extra input plane" if len(used) == 1 else "extra input planes"
    return (
        used,
        f"every training image has {', '.join(used)}: stacked as {planes} after the tested image{left}",
    )


def check_companions(config: TrainConfig, stats: SplitStats) -> None:
    """ConfigError for a companion the user named that the dataset does not declare (listing the ones it has)."""
    unknown = [name for name in config.companions or [] if name not in stats.companion_names]
    if unknown:
        declared = ", ".join(stats.companion_names) or "none"
        raise ConfigError(
            f"field 'companions': {config.data} has no companion {', '.join(map(repr, unknown))} "
            f"(its companions: {declared})"
        )


def auto_clean_templates(stats: SplitStats, template: bool) -> tuple[bool, str]:
    if template:
        return False, "the model reads each template as its second input"
    if not stats.with_template:
        return False, "the dataset has no templates"
    return False, (
        f"the data has {stats.with_template} templates, but they stay out of a run without templates: as "
        "extra defect-free images they lowered DeepPCB's held-out mAP@0.5 in 10 minutes; "
        "`--set clean_templates=true` adds them"
    )


def auto_pretrained(preset: str, template: bool, companions: int = 0) -> tuple[bool, str]:
    """Start from the shipped weights (model.pretrained) when the package has them for this preset and
    input layout; the fine-tuning data then only has to teach its own classes and look."""
    from defectdet.model.detector import has_imagenet_backbone
    from defectdet.model.pretrained import layout_name, shipped_weights

    if has_imagenet_backbone(preset):
        from defectdet.model import imagenet

        if imagenet.weights_path() is None:
            return False, imagenet.missing_reason()
        return True, f"ImageNet features from the {imagenet.DISTRIBUTION} package ({imagenet.LICENCE})"

    path = shipped_weights(preset, template)
    if path is None:
        return False, f"no shipped weights for the {preset} preset with the {layout_name(template)} layout"
    zero = "; the companion planes' stem weights start at zero" if companions else ""
    return True, f"{path.name}, learned on synthetic boards and surfaces (make pretrain){zero}"


def auto_backbone_lr_scale(preset: str, pretrained: bool) -> tuple[float, str]:
    """A quarter of lr for a backbone that starts from ImageNet features, the full lr otherwise."""
    from defectdet.model.detector import has_imagenet_backbone

    if pretrained and has_imagenet_backbone(preset):
        return IMAGENET_BACKBONE_LR_SCALE, (
            f"the backbone starts from ImageNet features: it learns at {IMAGENET_BACKBONE_LR_SCALE:g} x lr so "
            "the new neck and head adapt to it without erasing what it knows"
        )
    return 1.0, "the backbone learns at the full learning rate"


def auto_frozen_stem(preset: str, pretrained: bool, template: bool, companions: int) -> tuple[bool, str]:
    """Freeze lite0's ImageNet stem and stride-2/4 blocks when its input is an image as ImageNet's were."""
    from defectdet.model.detector import has_imagenet_backbone

    if not has_imagenet_backbone(preset):
        return False, f"the {preset} preset trains every layer"
    if not pretrained:
        return False, "the backbone starts from random weights: every layer trains"
    if template or companions:
        return False, "the stem must learn to combine the template or companion planes: every layer trains"
    return True, (
        "the ImageNet stem and the blocks at strides 2 and 4 keep their weights: generic edge and texture "
        "filters, and a third of the step's time at full resolution, spent on more steps instead"
    )


def auto_class_balance(stats: SplitStats) -> tuple[str, str]:
    counts = stats.class_images
    names = stats.class_names
    missing = [names[index] for index in np.flatnonzero(counts == 0)]
    present = np.flatnonzero(counts > 0)
    note = f"; no training image of {', '.join(missing)}" if missing else ""
    if len(present) < 2:
        return "off", f"fewer than two classes occur{note}"
    rare, common = present[np.argmin(counts[present])], present[np.argmax(counts[present])]
    ratio = counts[common] / counts[rare]
    detail = f"{names[rare]} in {counts[rare]} images, {names[common]} in {counts[common]} ({ratio:.1f}x)"
    if ratio >= BALANCE_RATIO:
        return "repeat", f"imbalanced: {detail}; images of rare classes repeated up to {MAX_REPEAT:g}x{note}"
    return "off", f"balanced within {ratio:.1f}x ({detail}){note}"


def auto_tiles(stats: SplitStats, input_size: int) -> tuple[bool, str]:
    from defectdet.data.tiling import MAX_TILES_PER_SIDE, TILE_TRIGGER

    if len(stats.box_wh) == 0:
        return False, "no boxes to size defects by"
    shrunk = stats.box_image_long > TILE_TRIGGER * input_size
    if not shrunk.any():
        return (
            False,
            f"no image is over {TILE_TRIGGER:g}x the {input_size} letterbox: whole images are enough",
        )
    share = float(np.mean(shrunk & (stats.box_size_at(input_size) < MIN_DEFECT_PX)))
    largest = float(stats.sizes.max()) if len(stats.sizes) else 0.0
    found = (
        f"{share:.0%} of defects are under {MIN_DEFECT_PX} px at {input_size} in images the letterbox shrinks "
        f"over {TILE_TRIGGER:g}x (up to {largest:.0f} px)"
    )
    if share < TILE_SHARE:
        return False, f"only {found}: whole images are enough"
    return True, (
        f"{found}: inference also runs those images as native-resolution tiles (at most "
        f"{MAX_TILES_PER_SIDE**2} more passes each) and keeps the tiles' small detections"
    )


def choose_settings(
    stats: SplitStats,
    config: TrainConfig,
    previous: dict[str, Any] | None = None,
    step_seconds: Callable[[StepShape], float] | None = None,
) -> tuple[TrainConfig, list[Choice]]:
    """Fill the config's auto (None) settings from `stats`; returns the filled config and one
    Choice per setting. `previous` (a resumed checkpoint's config) wins over the data for auto fields.
    `step_seconds` times a training step of a given shape (engine.step_speed): with a time budget it decides
    whether lite0 fits it. Pure otherwise: no IO."""
    if previous is not None:  # a checkpoint written before the renaming uses retired names
        previous = current_keys(previous, Surface.TRAIN_CONFIG, warn=False)
    made = _Decisions(config, previous)
    input_size, crop, template = _decide_input(made, stats)
    lite0_step = None
    if config.preset is None and not (previous or {}).get("preset") and not template:
        lite0_step = _lite0_step(config, made.values, crop or input_size, step_seconds)
    preset = made.decide("preset", *auto_preset(bool(template), lite0_step))
    made.decide("strides", *auto_strides(stats, input_size, preset))
    made.decide("batch", *auto_batch(crop or input_size, preset))
    made.decide("class_balance", *auto_class_balance(stats))
    made.decide("tiles", *auto_tiles(stats, input_size))
    made.decide("clean_templates", *auto_clean_templates(stats, bool(template)))
    _decide_start(made, preset, bool(template))
    made.choices.append(_NO_REGRESSION_RANGES)
    for note in stats.notes:
        logger.warning("settings from the data: %s", note)
    return config.model_copy(update=made.values), made.choices


_NO_REGRESSION_RANGES = Choice(
    "regression ranges",
    "none",
    "task-aligned assignment over every level (score x IoU) and unbounded softplus x stride "
    "distances leave no size ranges to tune",
    "fixed",
)


@dataclass
class _Decisions:
    """The settings decided so far (`values`) and why (`choices`): the user's value wins, then a resumed
    checkpoint's (`previous`), then the data's."""

    config: TrainConfig
    previous: dict[str, Any] | None
    choices: list[Choice] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)

    def decide(self, name: str, auto_value: Any, auto_reason: str) -> Any:
        given = getattr(self.config, name)
        if given is not None:
            reason = "set by you"
            if given != auto_value:
                reason += f"; from the data: {_show(auto_value)} ({auto_reason})"
            self.choices.append(Choice(name, given, reason, "user"))
            value = given
        elif self.previous is not None and self.previous.get(name) is not None:
            value = self.previous[name]
            self.choices.append(Choice(name, value, "kept from the checkpoint being resumed", "checkpoint"))
        else:
            value = auto_value
            self.choices.append(Choice(name, value, auto_reason, "auto"))
        self.values[name] = value
        return value

    def keep_from_checkpoint(self, name: str, value: Any) -> None:
        """`name` as a checkpoint from before the setting existed had it (its model was built so)."""
        self.values[name] = value
        self.choices.append(Choice(name, value, "kept from the checkpoint being resumed", "checkpoint"))

    def predates(self, name: str) -> bool:
        """Whether `name` is left to the data while a resumed checkpoint has no value for it."""
        return (
            getattr(self.config, name) is None
            and self.previous is not None
            and self.previous.get(name) is None
        )


def _decide_input(made: _Decisions, stats: SplitStats) -> tuple[int, int, bool]:
    """The input settings (size, crops, channels, template, companions); returns (input size, crop, template)."""
    config = made.config
    auto_size, size_reason = auto_input_size(stats)
    if config.input_size is None and (config.crop_size == 0 or auto_crop(stats, auto_size)[0] == 0):
        smaller, why = shrink_whole_images(stats, auto_size)
        if why:
            auto_size, size_reason = smaller, f"{size_reason}; {why}"
    input_size = made.decide("input_size", auto_size, size_reason)
    crop = made.decide("crop_size", *auto_crop(stats, input_size))
    made.decide("channels", *auto_channels(stats))
    template = made.decide("template", *auto_template(stats))
    check_companions(config, stats)
    if config.companions is None and made.previous is not None and "companions" not in made.previous:
        made.keep_from_checkpoint("companions", [])  # from before companions existed: its model takes none
    else:
        made.decide("companions", *auto_companions(stats))
    return input_size, crop, template


def _decide_start(made: _Decisions, preset: str, template: bool) -> None:
    """Where the weights start and how the backbone learns (pretrained, backbone_lr_scale, frozen_stem)."""
    companions = len(made.values["companions"])
    if made.predates("pretrained"):  # from before shipped weights existed: it started from random weights
        made.keep_from_checkpoint("pretrained", False)
    else:
        made.decide("pretrained", *auto_pretrained(preset, template, companions))
    pretrained = bool(made.values["pretrained"])
    made.decide("backbone_lr_scale", *auto_backbone_lr_scale(preset, pretrained))
    made.decide("frozen_stem", *auto_frozen_stem(preset, pretrained, template, companions))


def _lite0_step(
    config: TrainConfig, values: dict[str, Any], size: int, step_seconds: Callable[[StepShape], float] | None
) -> tuple[int | None, float] | None:
    """(steps lite0 would train in the time budget or None without one, seconds per step); None untimed."""
    from defectdet.model.imagenet import weights_path

    if step_seconds is None or weights_path() is None:  # without the weights lite0 is never chosen
        return None
    companions = len(values["companions"])
    batch = config.batch or auto_batch(size, "lite0")[0]
    frozen = auto_frozen_stem("lite0", config.pretrained is not False, False, companions)[0]
    seconds = step_seconds(StepShape("lite0", values["channels"], False, companions, size, batch, frozen))
    budget = config.time_budget_seconds
    return (None if budget is None else int(budget / max(seconds, 1e-6))), seconds


def _show(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    if value == 0 and not isinstance(value, bool):
        return "0 (off)"
    return str(value)


def repeat_factors(split: DatasetSplit, seed: int = 0) -> np.ndarray:
    """Integer repeats per sample (repeat-factor sampling, LVIS-style): class c gets
    r_c = min(MAX_REPEAT, sqrt(f_max / f_c)) with f the share of images containing c; an image
    repeats max r_c over its classes, rounded stochastically (seeded) so the mean repeat is kept."""
    num_classes = len(split.class_names)
    counts = np.zeros(num_classes, np.float64)
    present_sets = []
    for sample in split.samples:
        present = np.unique(sample.classes[(sample.classes >= 0) & (sample.classes < num_classes)])
        present_sets.append(present)
        counts[present] += 1
    if not counts.any():
        return np.ones(len(split.samples), np.int64)
    class_factor = np.where(
        counts > 0, np.minimum(MAX_REPEAT, np.sqrt(counts.max() / np.maximum(counts, 1))), 1.0
    )
    image_factor = np.array([class_factor[p].max() if len(p) else 1.0 for p in present_sets])
    draws = np.random.default_rng([seed, 0xBA1]).random(len(image_factor))
    return (np.floor(image_factor) + (draws < image_factor % 1)).astype(np.int64)


def balance_split(split: DatasetSplit, seed: int = 0) -> DatasetSplit:
    """The split with rare-class samples repeated per `repeat_factors` (same objects, repeated)."""
    repeats = repeat_factors(split, seed)
    samples = [
        sample for sample, count in zip(split.samples, repeats.tolist(), strict=True) for _ in range(count)
    ]
    return dataclasses.replace(split, samples=samples)


def add_clean_templates(split: DatasetSplit) -> DatasetSplit:
    """The split plus each distinct template as a sample without boxes (for a model trained without
    templates): the defect-free twin of every defective image. Ids end in `_template`."""
    seen: set[Path] = set()
    extra: list[Sample] = []
    for sample in split.samples:
        path = sample.template_path
        if path is None or path in seen:
            continue
        seen.add(path)
        extra.append(
            defect_free_sample(
                path,
                f"{sample.source or sample.image_path} (its template, no defects)",
                f"{sample.image_id}_template",
            )
        )
    return _with_samples(split, extra)


def no_clean_images_row(template: bool) -> Choice:
    """The settings row of a run without `clean_images`: what the option is for, and what it measured."""
    if template:
        return Choice(
            "clean_images", None, "none: the template already shows what is drawn on purpose", "auto"
        )
    return Choice(
        "clean_images",
        None,
        "none given: `--clean-images DIR` trains on defect-free images of the line too; on a board design the "
        "model never saw, 40 golden images raised held-out mAP@0.5 in 10 minutes (see the accuracy benchmarks)",
        "auto",
    )


def add_clean_images(split: DatasetSplit, paths: list[Path]) -> DatasetSplit:
    """The split plus each image of `paths` as a sample without boxes (`clean_images`). Ids are
    `clean/<file name>` (with a counter when two share a name), so they never collide with the split's."""
    extra = []
    used: set[str] = set()
    for path in paths:
        image_id = f"clean/{path.name}"
        counter = 1
        while image_id in used:
            counter += 1
            image_id = f"clean/{path.name}#{counter}"
        used.add(image_id)
        extra.append(defect_free_sample(path, f"{path} (clean_images, no defects)", image_id))
    return _with_samples(split, extra)


def defect_free_sample(path: Path, source: str, image_id: str) -> Sample:
    """`path` as a training sample without boxes (clean templates, clean images, synthetic board designs)."""
    return Sample(path, np.zeros((0, 4), np.float32), np.zeros(0, np.int64), source=source, image_id=image_id)


def _with_samples(split: DatasetSplit, extra: list[Sample]) -> DatasetSplit:
    return dataclasses.replace(split, samples=split.samples + extra)


def model_overrides(config: TrainConfig) -> dict[str, Any]:
    """`build_model` keyword overrides for the chosen settings (head levels from `strides`; lite0's frozen
    stem)."""
    overrides: dict[str, Any] = {}
    if config.strides:
        overrides["levels"] = tuple(ALL_STRIDES.index(stride) for stride in config.strides)
    if config.frozen_stem:
        overrides["frozen_stem"] = True
    return overrides


# each setting of the table in words, for people who have not read the configuration reference
PLAIN_NAMES: dict[str, str] = {
    "input_size": "input size (px)",
    "crop_size": "training crops (px)",
    "channels": "colour channels",
    "template": "golden template",
    "companions": "companion captures",
    "preset": "model size",
    "strides": "detection grids (px per cell)",
    "batch": "images per step",
    "class_balance": "rare classes shown more",
    "tiles": "large images cut in tiles",
    "clean_templates": "templates as good parts",
    "clean_images": "defect-free images",
    "synthetic_boards": "synthetic boards added",
    "pretrained": "starts from shipped weights",
    "backbone_lr_scale": "backbone learning-rate factor",
    "frozen_stem": "first layers kept as shipped",
}


def train_option(name: str) -> str:
    """How `train` sets the field `name`: its own option (the first of a --x/--no-x pair), else `--set`."""
    from defectdet.engine.config import TRAIN_OPTIONS

    option = TRAIN_OPTIONS.get(name)
    if option is None:
        return f"--set {name}=..."
    return (option.flag or "--" + name.replace("_", "-")).split("/")[0]


def choices_table(choices: list[Choice], title: str = "settings chosen for this run"):
    """A rich Table: the setting in words with the option that changes it | value | why (who decided).
    Fixed design facts (source "fixed", nothing to change) stay out: config.yaml's notes keep them."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    table.add_column("setting (option)")
    table.add_column("value", justify="right")
    table.add_column("why")
    for choice in choices:
        if choice.source == "fixed":
            continue
        who = "" if choice.source in ("auto", "model") else f" [{choice.source}]"  # model: in the reason
        option = train_option(choice.name)
        label = f"{PLAIN_NAMES[choice.name]} ({option})" if choice.name in PLAIN_NAMES else option
        # escaped: "[from model]" and the " [user]" suffix are text, not rich markup
        table.add_row(escape(label), escape(_show(choice.value)), escape(choice.reason + who))
    return table
