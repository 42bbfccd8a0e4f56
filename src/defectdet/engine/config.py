"""Training configuration: one typed source of defaults, loaded from YAML plus overrides.

An unknown key (in the file or in an override) is an error naming it, with close matches suggested.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from defectdet.cli_option import CliOption
from defectdet.compat import Surface, current_keys
from defectdet.defaults import DEFAULT_MAX_DETECTIONS, DEFAULT_NMS_IOU, DEFAULT_SCORE_FLOOR
from defectdet.errors import ConfigError
from defectdet.trainingdata.augment_config import AugmentConfig

DEFAULT_EPOCHS = 50
VAL_BUDGET_SHARE = 0.1  # with a time budget and no val_every: about ten validations per run
# AdamW: what bench/results/train_deeppcb_*.json ran with
DEFAULT_LEARNING_RATES = {"adamw": 0.008, "sgd": 0.01}
DEFAULT_WEIGHT_DECAY = {"adamw": 0.05, "sgd": 0.0005}
# continuing from a trained model: small steps keep what it learned (the usual fine-tuning tenth)
FINE_TUNE_LR_FACTOR = 0.1


class TrainConfig(BaseModel):
    """Everything `train` needs. Written to `RUN_DIR/config.yaml` and stored in checkpoints."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # data
    data: Path | None = None  # data.yaml, COCO json, VOC folder or DeepPCB root
    train_split: str = "train"  # the split trained on
    val_split: str | None = "val"  # the split validated on; None: no validation
    format: str | None = None  # yolo, coco, voc or deeppcb; None: detected
    # None = chosen from the data before the first step, printed as a table
    input_size: int | None = Field(None, ge=32)  # letterbox size S (the model's input side), a multiple of 32
    crop_size: int | None = Field(None, ge=0)  # train on random crops of this size; 0 = whole images
    channels: Literal[1, 3] | None = None  # 1 gray, 3 RGB
    template: bool | None = None  # compare against the template image (needs one per image)
    # aligned companion captures (another lighting, focus or band) stacked as extra input planes, in this order;
    # None: every companion every training image has, in the dataset's order; []: none
    companions: list[str] | None = None
    strides: list[Literal[8, 16, 32]] | None = None  # feature strides the head predicts at
    class_balance: Literal["off", "repeat"] | None = None  # 'repeat': repeat images of rare classes
    tiles: bool | None = None  # inference also runs native-resolution tiles of images >= 1.5x input_size
    # training without templates on paired data: each golden template also trains as a defect-free image
    # (None: off, engine.autoconfig says why)
    clean_templates: bool | None = None
    # a folder of defect-free images (good parts of this line, a new board design's golden images): trained on
    # as images without defects, so what they show (a drill hole drawn on purpose) stops drawing false calls
    clean_images: Path | None = None
    # synthetic PCB boards (`defectdet synth`) drawn into the training split, classes matched by name: they show
    # drilled pads and vias of many designs as design; 0 = none
    synthetic_boards: int = Field(0, ge=0, le=10000)
    # what of each synthetic board trains: 'defects' the damaged board; 'design' its defect-free design only (an
    # image without boxes); 'both' the two (2 N images)
    synthetic_boards_mode: Literal["defects", "design", "both"] = "defects"
    batch: int | None = Field(None, ge=1)  # None: ~16 x 320^2 pixels per step
    workers: int | None = Field(None, ge=0)  # data loader processes; None: from the CPU count
    # decoded + registered + letterboxed training pairs kept in RAM (MB per loading process); None: a quarter
    # of the available memory, at most 4096; 0: off
    cache_mb: int | None = Field(None, ge=0)
    augment: AugmentConfig = Field(default_factory=AugmentConfig)

    # model
    preset: str | None = None  # None: from the data: nano with templates; without, lite0 or tiny (step time)
    # start from the weights shipped for the preset and input layout; None: when they exist
    pretrained: bool | None = None
    # continue from a deployed model (checkpoint .pt or bundle .onnx, `train --from`): its architecture and
    # weights, classes matched by name; a tenth of the default lr unless lr is set
    start_from: Path | None = None
    old_data: Path | None = None  # with start_from: old training data mixed with `data`
    # with old_data: the least share of each epoch drawn from `data` (new images repeated); the default lets a
    # few dozen captures count while most of each epoch keeps showing the old line
    new_share: float = Field(0.3, gt=0, lt=1)

    # budget: epochs, wall-clock minutes, or both (whichever ends first; the LR schedule follows epochs then)
    epochs: int | None = Field(None, ge=1)  # None: 50, or none with time_minutes
    time_minutes: float | None = Field(None, gt=0)  # wall-clock budget in minutes
    max_steps: int | None = Field(None, ge=1)  # hard stop after this many optimizer steps (smoke tests)

    # optimisation
    optimizer: Literal["adamw", "sgd"] = "adamw"  # AdamW, or SGD with momentum
    lr: float | None = Field(None, gt=0)  # None: 0.008 (adamw) or 0.01 (sgd), a tenth with start_from
    weight_decay: float | None = Field(None, ge=0)  # None: 0.05 (adamw) or 0.0005 (sgd)
    # the backbone's learning rate as a share of lr; None: chosen with the preset: smaller
    # for a backbone that starts from ImageNet features, so the new neck and head learn without erasing them
    backbone_lr_scale: float | None = Field(None, gt=0, le=1)
    # lite0: keep the ImageNet stem and the blocks at strides 2 and 4 as they are; None: chosen from the
    # input layout
    frozen_stem: bool | None = None
    momentum: float = Field(0.9, ge=0, lt=1)  # SGD momentum, AdamW beta1
    warmup_epochs: float = Field(1.0, ge=0)  # linear learning-rate warm-up
    warmup_steps: int | None = Field(None, ge=0)  # overrides warmup_epochs when set
    final_lr_ratio: float = Field(0.05, ge=0, le=1)  # the cosine schedule ends at lr x this
    clip_grad_norm: float | None = Field(10.0, gt=0)  # gradient norm clipped to this; None: no clipping
    ema: bool = True  # keep an exponential moving average of the weights (validated, saved, exported)
    ema_decay: float = Field(0.995, gt=0, lt=1)  # ~200-step horizon: CPU budgets are 1-4 thousand steps
    ema_ramp_steps: float = Field(200.0, gt=0)  # decay = ema_decay * (1 - exp(-updates / ema_ramp_steps))
    amp: bool | None = None  # None: fp16 on CUDA, off on CPU
    amp_dtype: Literal["float16", "bfloat16"] | None = None  # 'bfloat16' enables autocast on CPU

    # run
    seed: int = 0  # random seed (data order, augmentation, initial weights)
    deterministic: bool = False  # deterministic kernels: repeatable, slower
    device: str = "auto"  # auto, cpu, cuda or cuda:N
    out: Path | None = None  # the run folder; None: runs/train
    resume: Path | None = None  # a last.pt to continue exactly from
    progress: bool = True  # progress bars

    # validation
    protocol: Literal["coco", "deeppcb", "both"] | None = None  # metrics; None: coco (both on DeepPCB data)
    # epochs between validations; None: every epoch, or with a time budget at the first epoch end after
    # each tenth of the budget, so validation does not eat a third of a short CPU budget
    val_every: int | None = Field(None, ge=1)
    # the score floor: lowest score kept as a proposal (defaults: defectdet.postprocess)
    score_floor: float = Field(DEFAULT_SCORE_FLOOR, ge=0, le=1)
    nms_iou: float = Field(DEFAULT_NMS_IOU, gt=0, le=1)  # IoU above which NMS drops the lower-scoring box
    max_detections: int = Field(DEFAULT_MAX_DETECTIONS, ge=1)  # the most detections kept per image
    # align each template to its tested image in training and evaluation
    register_pairs: bool = True

    # diagnostics
    grad_stats_every: int = Field(100, ge=1)  # steps between gradient-statistics log lines
    on_nonfinite: Literal["skip", "stop"] = "skip"  # on a NaN/Inf loss or gradient: skip the step or stop
    max_consecutive_nonfinite: int = Field(20, ge=1)  # skipped steps in a row before the run stops

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit()):
            return value
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {value!r}")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, values: Any) -> Any:
        """Keys retired for one name per concept (`defectdet.compat`) still load, with a warning."""
        return (
            current_keys(values, Surface.TRAIN_CONFIG, "TrainConfig", stacklevel=5)
            if isinstance(values, dict)
            else values
        )

    @field_validator("input_size", "crop_size")
    @classmethod
    def _check_multiple_of_32(cls, value: int | None, info: Any) -> int | None:
        if value and value % 32:
            raise ValueError(
                f"{info.field_name} must be a multiple of 32 (the model's coarsest stride), got {value}"
                + ("; 0 = no crops" if info.field_name == "crop_size" else "")
            )
        return value

    @field_validator("companions")
    @classmethod
    def _check_companions(cls, value: list[str] | None) -> list[str] | None:
        from defectdet.data.sample import companion_name_problem

        if value is None:
            return value
        for name in value:
            problem = companion_name_problem(name)
            if problem is not None:
                raise ValueError(problem)
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            raise ValueError(f"companions must not repeat a name: {', '.join(repeated)}")
        return value

    @field_validator("strides")
    @classmethod
    def _check_strides(cls, value: list[int] | None) -> list[int] | None:
        if value is not None:
            if not value:
                raise ValueError("strides must name at least one of 8, 16, 32")
            value = sorted(set(value))
        return value

    @model_validator(mode="after")
    def _fill_defaults(self) -> TrainConfig:
        # Resolve optimizer-dependent defaults here so config.yaml records the values actually used.
        # (object.__setattr__ avoids re-running validation through validate_assignment.)
        if self.lr is None:
            factor = FINE_TUNE_LR_FACTOR if self.start_from is not None else 1.0
            object.__setattr__(self, "lr", DEFAULT_LEARNING_RATES[self.optimizer] * factor)
        if self.weight_decay is None:
            object.__setattr__(self, "weight_decay", DEFAULT_WEIGHT_DECAY[self.optimizer])
        if self.epochs is None and self.time_minutes is None:
            object.__setattr__(self, "epochs", DEFAULT_EPOCHS)
        return self

    @property
    def time_budget_seconds(self) -> float | None:
        return None if self.time_minutes is None else self.time_minutes * 60.0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (paths as strings), for config.yaml and checkpoints."""
        return self.model_dump(mode="json")


def _suggest(key: str, candidates: list[str]) -> str:
    matches = difflib.get_close_matches(key, candidates, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(m) for m in matches)}?" if matches else ""


def _model_fields(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def check_unknown_keys(values: dict[str, Any], where: str) -> None:
    """Raise ConfigError for keys TrainConfig (or its nested augment config) does not know."""
    known = _model_fields(TrainConfig)
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}{_suggest(key, known)}")
        if key == "augment" and AugmentConfig is not None and isinstance(value, dict):
            nested = _model_fields(AugmentConfig)
            for sub_key in value:
                if sub_key not in nested:
                    raise ConfigError(f"{where}: unknown key 'augment.{sub_key}'{_suggest(sub_key, nested)}")


def _apply_override(values: dict[str, Any], dotted_key: str, value: Any) -> None:
    parts = dotted_key.split(".")
    target = values
    for part in parts[:-1]:
        current = target.get(part)
        if current is None:
            current = {}
        elif isinstance(current, BaseModel):
            current = current.model_dump()
        elif not isinstance(current, dict):
            raise ConfigError(f"override {dotted_key!r}: {part!r} is not a section")
        target[part] = current
        target = current
    target[parts[-1]] = value


def _format_validation_error(error: ValidationError, where: str) -> str:
    lines = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "(config)"
        if item["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown key {field!r}")
        else:
            lines.append(f"{where}: field {field!r}: {item['msg']} (got {item.get('input')!r})")
    return "\n".join(lines)


def config_from_dict(values: dict[str, Any], where: str = "config") -> TrainConfig:
    """Validate a plain dict; errors become ConfigError naming the field and `where` it came from."""
    values = current_keys(values, Surface.TRAIN_CONFIG, where, warn=False)
    check_unknown_keys(values, where)
    try:
        return TrainConfig(**values)
    except ValidationError as error:
        raise ConfigError(_format_validation_error(error, where)) from None


def load_config(yaml_path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read `yaml_path` (optional) and apply `overrides` (keys may be dotted, e.g. 'augment.flip').

    Overrides are applied as given, including None values: pass only what the user set.
    """
    import yaml  # here, not at the top: the command line reads these settings at start without it

    values: dict[str, Any] = {}
    where = "overrides"
    if yaml_path is not None:
        path = Path(yaml_path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise ConfigError(f"{path}: cannot read config file ({error.strerror or error})") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{path}{line}: invalid YAML ({getattr(error, 'problem', error)})") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of config keys, got {type(loaded).__name__}")
        loaded = current_keys(loaded, Surface.TRAIN_CONFIG, str(path))
        check_unknown_keys(loaded, str(path))
        values.update(loaded)
        where = str(path)
    for key, value in current_keys(overrides or {}, Surface.TRAIN_CONFIG, "override").items():
        top = key.split(".")[0]
        check_unknown_keys({top: {}}, "override")
        if "." in key and top == "augment" and AugmentConfig is not None:
            check_unknown_keys({"augment": {key.split(".", 1)[1].split(".")[0]: None}}, "override")
        _apply_override(values, key, value)
    if overrides:
        where = f"{where} + overrides" if yaml_path is not None else "overrides"
    return config_from_dict(values, where)


def save_config(config: TrainConfig, path: str | Path, notes: list[str] | None = None) -> None:
    """Write `config` as YAML; `notes` become leading `# ` comment lines (e.g. why settings were chosen)."""
    import yaml

    header = "".join(f"# {line}\n" for note in notes or [] for line in note.splitlines())
    Path(path).write_text(header + yaml.safe_dump(config.to_dict(), sort_keys=False), encoding="utf-8")


def parse_overrides(assignments: list[str]) -> dict[str, Any]:
    """`["lr=0.01", "augment.rotate_degrees=0"]` -> `{"lr": 0.01, "augment.rotate_degrees": 0}` (values parsed as YAML)."""
    import yaml

    overrides: dict[str, Any] = {}
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE, e.g. --set ema_decay=0.999")
        try:
            overrides[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError as error:
            raise ConfigError(f"--set {assignment!r}: the value is not valid YAML ({error})") from None
    return overrides


def _comma_list(text: str) -> list[str]:
    return [part for part in text.replace(" ", "").split(",") if part]


def _strides_from_text(text: str) -> list[int]:
    try:
        return [int(part) for part in _comma_list(text)]
    except ValueError:
        raise ConfigError(
            f"--strides: expected numbers from 8,16,32 separated by commas, got {text!r}"
        ) from None


# `defectdet train`'s options, in the order its help lists them: one per field shown on the command line (the
# rest through --set). Each defaults to not given, so that a value from --config stays.
TRAIN_OPTIONS: dict[str, CliOption] = {
    "preset": CliOption(
        help="Model preset (see `defectdet presets`; default: nano with templates; without, lite0 when the time "
        "budget buys it enough steps, else tiny)."
    ),
    "pretrained": CliOption(
        flag="--from-scratch",
        help="Start from random weights instead of the weights shipped for the preset (see the settings table).",
        default=False,
        to_setting=lambda scratch: False if scratch else None,
    ),
    "start_from": CliOption(
        flag="--from",
        help="Continue from a deployed model (best.pt, or a model.onnx exported with its weights): its "
        "architecture and weights, classes matched by name, a tenth of the default lr. A good-parts-only model "
        "(`fit`) has no detector weights: a new detector is trained on DATA from the standard start.",
    ),
    "old_data": CliOption(help="With --from: the old training data, mixed in and validated on too."),
    "new_share": CliOption(
        help="With --old-data: the least share of each epoch drawn from DATA (default 0.3)."
    ),
    "input_size": CliOption(
        help="Letterbox size S, a multiple of 32 (default: chosen from the image and defect sizes)."
    ),
    "crop_size": CliOption(
        flag="--crop", help="Train on random crops of this size; 0 = whole images (default: from the data)."
    ),
    "template": CliOption(
        flag="--template/--no-template",
        help="Use the dataset's templates (default: when every image has one).",
    ),
    "companions": CliOption(
        help="Companion captures to stack as extra input planes, in this order, e.g. L2,UV (default: every "
        "companion every training image has).",
        type=str,
        to_setting=_comma_list,
    ),
    "channels": CliOption(help="1 gray or 3 RGB input (default: from the images)."),
    "strides": CliOption(
        help="Head strides, e.g. 8,16,32 (default: the preset's, plus 32 for large defects).",
        type=str,
        to_setting=_strides_from_text,
    ),
    "epochs": CliOption(help="Number of epochs."),
    "time_minutes": CliOption(flag="--time", help="Wall-clock budget in minutes (instead of epochs)."),
    "batch": CliOption(help="Batch size."),
    "workers": CliOption(help="DataLoader workers (default: picked from the CPU count)."),
    "lr": CliOption(help="Peak learning rate."),
    "out": CliOption(help="Run folder (default runs/train)."),
    "resume": CliOption(help="Checkpoint to continue exactly from."),
    "device": CliOption(help="auto|cpu|cuda."),
    "amp": CliOption(
        flag="--amp/--no-amp",
        help="Mixed precision: default fp16 on CUDA, off on CPU. On CPU it needs --set amp_dtype=bfloat16 and "
        "pays only on CPUs with bfloat16 matrix units (Intel AMX); elsewhere it is much slower (see the "
        "training-speed benchmarks).",
    ),
    "seed": CliOption(help="Random seed."),
    "clean_images": CliOption(
        help="Folder of defect-free images (good parts, a new board design's golden images): they train as "
        "images without defects. Models without templates only."
    ),
    "synthetic_boards": CliOption(
        help="Mix N synthetic PCB boards (drawn like `defectdet synth`, cached) into training, classes matched by "
        "name: they show drilled pads and vias of many designs as design. For PCB data without templates and a "
        "--time of 20 minutes or more (with templates, or in 10 minutes, they cost accuracy)."
    ),
    "train_split": CliOption(help="Split to train on (default train)."),
    "val_split": CliOption(help="Split to validate on (default val)."),
    "on_nonfinite": CliOption(help="skip|stop on a NaN/Inf loss or gradient."),
    "format": CliOption(flag="--format", help="yolo|coco|voc|deeppcb (default: detected)."),
}
