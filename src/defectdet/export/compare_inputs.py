"""What `defectdet compare` may compare, and on which images: the models' layouts and class lists
(`check_comparable`, `class_space`), the held-out split (`held_out_split`) and the clean boards (`clean_folder`,
`auto_clean_boards`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from defectdet.data.sample import DatasetSplit, Sample
from defectdet.errors import DatasetError, InputError
from defectdet.runtime.anomaly_map import is_good_only
from defectdet.runtime.bundle import BundleMetadata

ROLES = ("old", "new")
ANOMALY = "anomaly"  # the class of a good-parts-only model's boxes
AGNOSTIC_CLASS = "defect"  # the one class of a class-agnostic comparison
LABELS = {"old": "OLD", "new": "NEW"}


def check_comparable(old: BundleMetadata, new: BundleMetadata, old_path: Path, new_path: Path) -> str:
    """Raise InputError naming every difference that makes the two models incomparable on the same images
    (input layout, channels, class lists that are not one list reordered or extended by NEW); return how the
    classes are matched."""
    problems = []
    if old.template != new.template:
        problems.append(
            f"layout: OLD {'compares each image with its template' if old.template else 'sees the image alone'} "
            f"(template={str(old.template).lower()}), NEW "
            f"{'compares each image with its template' if new.template else 'sees the image alone'} "
            f"(template={str(new.template).lower()})"
        )
    if old.channels != new.channels:
        problems.append(f"channels: OLD takes {_channels(old.channels)}, NEW takes {_channels(new.channels)}")
    for role, meta in (("OLD", old), ("NEW", new)):
        repeated = sorted({name for name in meta.class_names if meta.class_names.count(name) > 1})
        if repeated:
            problems.append(
                f"classes: {role} names {repeated} more than once, so they cannot be matched by name"
            )
    only_old = [name for name in old.class_names if name not in new.class_names]
    only_new = [name for name in new.class_names if name not in old.class_names]
    agnostic = class_agnostic(old, new)
    if only_old and not agnostic:
        problems.append(
            f"classes: only OLD detects {only_old}"
            + (f", only NEW detects {only_new}" if only_new else "")
            + " (NEW may list OLD's classes in another order or add classes; they are matched by name)"
        )
    if problems:
        raise InputError(
            f"OLD {old_path} and NEW {new_path} cannot be compared on the same images: " + "; ".join(problems)
        )
    if agnostic:
        role = "OLD" if is_good_only(old) else "NEW"
        return (
            f"class-agnostic: {role} is a good-parts-only model (boxes of one class, {ANOMALY!r}), OLD detects "
            f"{old.class_names} and NEW {new.class_names}; every box of either model and of the labels counts as "
            f"one class, {AGNOSTIC_CLASS!r} (mAP, escapes and disagreements ignore the class)"
        )
    if only_new:
        return f"NEW adds {only_new} to OLD's classes; classes are matched by name (OLD cannot detect the new ones)"
    if old.class_names != new.class_names:
        return "same classes in another order; matched by name"
    return "identical class lists"


def class_agnostic(old: BundleMetadata, new: BundleMetadata) -> bool:
    """Whether the comparison ignores classes: one model is good-parts-only (it knows no defect class) and the
    two class lists differ (a detector trained from its reviewed boxes names real classes)."""
    return (is_good_only(old) or is_good_only(new)) and old.class_names != new.class_names


def agnostic_split(dataset: DatasetSplit) -> DatasetSplit:
    """`dataset` with every box of one class, `AGNOSTIC_CLASS`."""
    samples = [replace(sample, classes=np.zeros_like(sample.classes)) for sample in dataset.samples]
    return replace(dataset, samples=samples, class_names=[AGNOSTIC_CLASS])


def _channels(channels: int) -> str:
    return f"{channels} channel{'s' if channels > 1 else ''} ({'gray' if channels == 1 else 'RGB'})"


def class_space(dataset: DatasetSplit, metas: dict[str, BundleMetadata], paths: dict[str, Path]) -> list[str]:
    """The evaluation's class list: the dataset's classes, then any class a model detects that the dataset does
    not label (its detections can only be false). A model that shares no class name with the dataset is refused."""
    names = list(dataset.class_names)
    for role in ROLES:
        model_names = metas[role].class_names
        if not set(model_names) & set(names):
            raise InputError(
                f"{LABELS[role]} {paths[role]} detects {model_names} but {dataset.root} split {dataset.split!r} "
                f"labels {names}: no class in common to match by name"
            )
        names += [name for name in model_names if name not in names]
    return names


# ------------------------------------------------------------------------------------------- images
def held_out_split(data: str | Path, split: str, format: str | None) -> tuple[DatasetSplit, str]:
    """`split` of `data`; when the dataset has no separate split (the reader gives the training images again),
    the trainer's fixed grouped hold-out of them (`data.holdout`), so the comparison never scores
    training images. Returns the split and a note saying which images these are."""
    from defectdet.data.formats import load_dataset
    from defectdet.data.holdout import hold_out, same_images

    dataset = load_dataset(data, split, format=format)
    note = f"split {split!r} of {data} ({len(dataset.samples)} images)"
    if split != "train":
        try:
            train = load_dataset(data, "train", format=format)
        except DatasetError:
            return dataset, note
        if same_images(train, dataset):
            dataset = hold_out(train)[1]
            note = (
                f"{data} has no separate {split!r} split: the training's grouped hold-out "
                f"({len(dataset.samples)} images)"
            )
    return dataset, note


def clean_folder(folder: Path, templates: Path | None, template: bool) -> list[Sample]:
    """The images of a folder of defect-free boards as samples without defects; with a template model each is
    paired as `defectdet predict` pairs (`--clean-templates` folder by name, or DeepPCB's ID_temp beside it)."""
    from defectdet.runtime.predict import list_sources, output_names, pair_template, template_inputs

    if not folder.is_dir():
        raise InputError(f"--clean {folder}: not a folder")
    if templates is not None and not templates.is_dir():
        raise InputError(f"--clean-templates {templates}: not a folder")
    images = list_sources(folder)
    skipped = template_inputs(images, templates) if template else set()
    samples = []
    for image, name in output_names([image for image in images if image not in skipped]).items():
        template_path = pair_template(image, templates) if template else None
        if template and template_path is None:
            raise InputError(
                f"{image}: the models compare each board with its template and this clean board has none "
                "(pass --clean-templates DIR with a template of the same name)"
            )
        samples.append(
            Sample(
                image_path=image,
                boxes=np.zeros((0, 4), np.float32),
                classes=np.zeros((0,), np.int64),
                template_path=template_path,
                source=f"clean board from {folder}",
                image_id=f"clean/{name.as_posix()}",
            )
        )
    if not samples:
        raise InputError(f"--clean {folder}: holds only templates, no clean board")
    return samples


def auto_clean_boards(dataset: DatasetSplit, out_dir: Path, channels: int, seed: int) -> list[Sample]:
    """One recapture (default nuisances: exposure, noise, JPEG, small shift and rotation) of each template of the
    split, as `bench/peers.py` and `defectdet val --clean-templates` make them."""
    from defectdet.data.recapture import RecaptureConfig, make_clean_boards

    if not dataset.has_templates:
        raise InputError(
            f"--clean-auto recaptures the split's templates and {dataset.root} split {dataset.split!r} has none; "
            "pass a folder of defect-free boards with --clean DIR"
        )
    return make_clean_boards(dataset, out_dir, RecaptureConfig(), channels=channels, seed=seed)
