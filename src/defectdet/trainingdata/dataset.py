"""The torch Dataset and its collate function (the DataLoader factory is `engine.loader.build_loader`).

An item is `(image Tensor[C,S,S] float32 in [0,1], target Tensor[N,5] (class, x1, y1, x2, y2) in the tensor's
pixels, meta dict)`, or `None` when the image could not be read: a bad file never stops an epoch.
`collate_detections` drops those `None`s.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from defectdet.data.imageio import DEFAULT_MAX_PIXELS, read_image, read_planes
from defectdet.data.letterbox import DEFAULT_INPUT_SIZE, boxes_to_letterbox, letterbox_image
from defectdet.data.planes import input_array, stack_planes
from defectdet.data.registration import register_pair
from defectdet.data.sample import DatasetSplit, Sample
from defectdet.errors import DatasetError, ImageReadError
from defectdet.trainingdata.augment import AugmentConfig, build_augment, clip_boxes_to_window
from defectdet.trainingdata.mosaic import Planes, mosaic_origin, tile_window

logger = logging.getLogger(__name__)

Item = tuple[torch.Tensor, torch.Tensor, dict[str, Any]]


@dataclass(frozen=True)
class ItemLayout:
    """What an item holds: every plane letterboxed to `input_size`, `channels` per plane (1 gray, 3 RGB), the
    template (None: when every sample has one) and the companion captures named, in that order, as `dtype`
    (torch.float32 in [0, 1] or torch.uint8 0..255)."""

    input_size: int = DEFAULT_INPUT_SIZE
    channels: int = 1
    template: bool | None = None
    companions: Sequence[str] = ()
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        object.__setattr__(self, "companions", tuple(self.companions))
        if self.channels not in (1, 3):
            raise ValueError(f"channels must be 1 (gray) or 3 (RGB), got {self.channels}")
        if self.input_size <= 0:
            raise ValueError(f"input_size must be positive, got {self.input_size}")
        if self.dtype not in (torch.float32, torch.uint8):
            raise ValueError(f"dtype must be torch.float32 or torch.uint8, got {self.dtype}")


@dataclass(frozen=True)
class Draws:
    """The random part of training items: `augment` (None: none) and `crop_size` windows (None: whole images),
    a window aimed at a defect `crop_defect_fraction` of the time, all drawn from `seed`. Only with `train`."""

    augment: AugmentConfig | None = None
    train: bool = False
    crop_size: int | None = None
    crop_defect_fraction: float = 0.8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.crop_size is not None and self.crop_size <= 0:
            raise ValueError(f"crop_size must be positive, got {self.crop_size}")


@dataclass(frozen=True)
class Reading:
    """How files are read: images over `max_pixels` refused, templates registered to their images
    (`register_pairs`), and up to `cache_bytes` of decoded planes kept per loading process (0: none)."""

    max_pixels: int = DEFAULT_MAX_PIXELS
    register_pairs: bool = True
    cache_bytes: int = 0


class DetectionDataset(Dataset):
    """Samples of a `DatasetSplit` as model-ready tensors.

    Pipeline per item: read the tested image (+ template, + companion captures) at `channels` -> letterbox
    every plane to `input_size` -> (train) augment -> (train, whole images, `augment.mosaic_prob`) sometimes a window
    onto it and three other augmented samples tiled (`trainingdata.mosaic`) -> (train, `crop_size < input_size`) a
    `crop_size` window, biased towards defects -> tensor `[C, S, S]`, C = channels x (1 + template + companions), planes in the order
    [tested, template, *companions].

    `layout` (`ItemLayout`) says what an item holds, `draws` (`Draws`) what is random in training items, `reading`
    (`Reading`) how files are read. `template=None` uses templates when every sample has one. `companions` names
    the companion captures to stack, in order; samples without one of them are left out with a warning (`left_out`
    lists their images). `augment=None` means no augmentation; augmentation and cropping only happen with
    `train=True`.

    `dtype=torch.uint8` returns raw 0..255 images instead of float32 0..1 (the caller then does
    `images.float().div_(255)`, ideally on the device): 4x less data through worker IPC and no float
    copies in the loader (throughput per dtype: bench/results/loader.json).

    Randomness (crop window, augmentation) is drawn from generators derived from `(seed, epoch, index)`
    when the index carries its epoch (`engine.loader.SampleIndex`, what `build_loader` yields): an item is
    then a pure function of those three, in this process or any loader worker, before or after a resume.
    A plain int index (`dataset[i]`) draws from a per-instance stream instead (`reseed` restarts it), so
    repeated calls still vary. All planes of a sample share one intensity mapping (`read_planes`).

    Unreadable images are skipped: a warning names the file once and `__getitem__` returns None.
    `skipped_paths` lists them, but only for reads done in this process: with loader workers each worker
    has its own copy of the dataset, logs its own warnings and keeps its own `skipped_paths`.
    """

    def __init__(
        self,
        split: DatasetSplit,
        layout: ItemLayout = ItemLayout(),
        draws: Draws = Draws(),
        reading: Reading = Reading(),
    ) -> None:
        self.split = split
        self.samples: list[Sample] = list(split.samples)
        self.companions = list(layout.companions)
        self.left_out = self._keep_with_companions()
        self.input_size = input_size = layout.input_size
        self.channels = layout.channels
        self.use_template = self._resolve_use_template(layout.template)
        # data.registration, before letterbox
        self.register_pairs = reading.register_pairs and self.use_template
        self.train = train = draws.train
        crop_size = draws.crop_size
        self.crop_size = crop_size if train and crop_size is not None and crop_size < input_size else None
        self.max_pixels = reading.max_pixels
        self.image_dtype = layout.dtype
        self.crop_defect_fraction = draws.crop_defect_fraction
        config = draws.augment or AugmentConfig(enabled=False)
        self.min_visibility = config.min_visibility
        self.seed = seed = draws.seed
        self.augmenter = build_augment(config, train=train and draws.augment is not None, seed=seed)
        # mosaic items in whole-image training only: a crop already varies what surrounds a defect
        whole_images = self.augmenter.active and self.crop_size is None and len(self.samples) > 1
        self.mosaic_prob = config.mosaic_prob if whole_images else 0.0
        self.skipped_paths: list[str] = []
        self._warned_resize: set[str] = set()  # plane kinds already warned about (template, each companion)
        self._unkeyed = np.random.default_rng(seed)  # draws for plain int indices
        self._rng = np.random.default_rng(seed)
        # decoded, registered and letterboxed pairs (everything before the random draws), up to a budget
        self.cache_bytes = max(0, int(reading.cache_bytes))
        self._cache: dict[int, tuple] = {}
        self._cache_used = 0
        self._cache_full_logged = False
        if self.cache_bytes:
            per_sample = input_size * input_size * self.input_channels
            fitting = min(len(self.samples), self.cache_bytes // per_sample)
            message = "decoded-image cache: up to %.0f MB per loading process, about %d of %d samples"
            logger.debug(message, self.cache_bytes / 2**20, fitting, len(self.samples))

    def _keep_with_companions(self) -> list[str]:
        """Leave out the samples that lack one of `companions` (warned once, with the count); their images."""
        if len(set(self.companions)) != len(self.companions):
            raise ValueError(f"companions must not repeat a name, got {self.companions}")
        for name in self.companions:
            if self.samples and not any(name in sample.companion_paths for sample in self.samples):
                declared = ", ".join(self.split.companion_names) or "none"
                raise DatasetError(
                    f"{self.split.root}: no image of split '{self.split.split}' has the companion '{name}' "
                    f"(the dataset's companions: {declared})"
                )
        has_all = [all(name in s.companion_paths for name in self.companions) for s in self.samples]
        kept = [sample for sample, keep in zip(self.samples, has_all, strict=True) if keep]
        left_out = [
            str(sample.image_path) for sample, keep in zip(self.samples, has_all, strict=True) if not keep
        ]
        if left_out:
            message = "leaving out %d of %d images of split '%s' without every companion (%s); first: %s"
            names = ", ".join(self.companions)
            logger.warning(message, len(left_out), len(self.samples), self.split.split, names, left_out[0])
        self.samples = kept
        return left_out

    def _resolve_use_template(self, use_template: bool | None) -> bool:
        missing = [sample for sample in self.samples if sample.template_path is None]
        if use_template is None:
            return bool(self.samples) and not missing
        if use_template and missing:
            first = missing[0]
            raise DatasetError(
                f"{first.source or first.image_path}: use_template=True but {len(missing)} of {len(self.samples)} "
                f"samples have no template (first: {first.image_path}); give every image a template or "
                "set use_template to false"
            )
        return use_template

    # sizes the model and the collate function need
    @property
    def input_channels(self) -> int:
        return self.channels * (1 + int(self.use_template) + len(self.companions))

    @property
    def output_size(self) -> int:
        return self.crop_size or self.input_size

    @property
    def output_shape(self) -> tuple[int, int, int]:
        return (self.input_channels, self.output_size, self.output_size)

    @property
    def class_names(self) -> list[str]:
        return self.split.class_names

    def reseed(self, seed: int) -> None:
        """Restart the stream that plain int indices draw from (a loader worker calls it with its seed).
        Indices that carry their epoch do not use it."""
        self._unkeyed = np.random.default_rng(seed)

    @property
    def is_random(self) -> bool:
        """Whether items are random (training crops or augmentation)."""
        return self.train and (self.crop_size is not None or self.augmenter.active)

    def _start_draws(self, index: int, epoch: int | None) -> None:
        """Seed the crop and augmentation generators for one item from (seed, epoch, index)."""
        if epoch is None:
            key = [self.seed, index, 1, int(self._unkeyed.integers(2**63))]
        else:
            key = [self.seed, index, 0, epoch]
        crop_state, augment_state = np.random.SeedSequence(key).generate_state(2)
        self._rng = np.random.default_rng(int(crop_state))
        if self.augmenter.active:
            self.augmenter.reseed(int(augment_state))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Item | None:
        epoch = getattr(index, "epoch", None)  # an engine.loader.SampleIndex carries its epoch
        index = int(index)
        sample = self.samples[index]
        if self.is_random:
            self._start_draws(index, epoch)
        prepared = self._cache.get(index) or self._prepare(index, sample)
        if prepared is None:
            return None
        _, _, _, transform, registration, (width, height) = prepared
        part = self._augmented(sample, prepared)
        if self.mosaic_prob and self._rng.random() < self.mosaic_prob:
            part = self._mosaic(part)
        image, template, companions = part.image, part.template, part.companions
        boxes, classes = part.boxes, part.classes
        size = self.input_size
        offset_x = offset_y = 0
        if self.crop_size is not None:
            size = self.crop_size
            offset_x, offset_y = self._crop_origin(boxes)
            rows, cols = slice(offset_y, offset_y + size), slice(offset_x, offset_x + size)
            image = image[rows, cols]
            template = None if template is None else template[rows, cols]
            companions = [plane[rows, cols] for plane in companions]
            window = (offset_x, offset_y, offset_x + size, offset_y + size)
            boxes, classes = clip_boxes_to_window(boxes, classes, window, self.min_visibility)
        else:
            # drop labels outside the canvas or empty; keep what the augmenter already filtered
            boxes, classes = clip_boxes_to_window(boxes, classes, (0, 0, size, size), 0.0)

        tensor = to_input_tensor(image, template, self.image_dtype, companions)  # (C, S, S)
        target = torch.from_numpy(
            np.concatenate([classes[:, None].astype(np.float32), boxes], axis=1)
        )  # (N, 5)
        meta = {
            "image_id": sample.image_id,
            "image_path": str(sample.image_path),
            "template_path": None if sample.template_path is None else str(sample.template_path),
            "companion_paths": {name: str(sample.companion_paths[name]) for name in self.companions},
            "transform": transform,
            "orig_size": (width, height),
            "crop_offset": (offset_x, offset_y),
            "registration": None if registration is None else registration.to_dict(),
        }
        return tensor, target, meta

    def _augmented(self, sample: Sample, prepared: tuple) -> Planes:
        """The augmented planes and labels of one prepared sample."""
        image, template, companions, transform, _, _ = prepared
        if self.augmenter.active:  # the augmenter may write into its inputs: keep the cached arrays intact
            image = image.copy()
            template = None if template is None else template.copy()
            companions = [plane.copy() for plane in companions]
        boxes = boxes_to_letterbox(sample.boxes, transform)
        return Planes(*self.augmenter.augment(image, template, companions, boxes, sample.classes))

    def _mosaic(self, part: Planes) -> Planes:
        """`part` and three other random samples, each augmented on its own, tiled (`trainingdata.mosaic`); `part` as it
        is when one of the others cannot be read."""
        others = []
        for _ in range(3):
            index = int(self._rng.integers(len(self.samples)))
            prepared = self._cache.get(index) or self._prepare(index, self.samples[index])
            if prepared is None:
                return part
            others.append(self._augmented(self.samples[index], prepared))
        parts = [part, *others]
        order = self._rng.permutation(4)
        origin = mosaic_origin(self.input_size, self._rng)
        return tile_window([parts[i] for i in order], self.input_size, origin, self.min_visibility)

    def _prepare(self, index: int, sample: Sample) -> tuple | None:
        """Decode (one intensity mapping for all planes), register the template and letterbox one sample: the
        deterministic part of an item, kept in the cache while it fits in ``cache_bytes``."""
        planes = self._read_planes(sample)
        if planes is None:
            return None
        image, template, companions = planes
        registration = None
        if template is not None:
            template = self._match_size(template, image, sample, "template", sample.template_path)
            if self.register_pairs:
                template, registration = register_pair(image, template)
        companions = [
            self._match_size(plane, image, sample, f"companion '{name}'", sample.companion_paths[name])
            for name, plane in zip(self.companions, companions, strict=True)
        ]
        height, width = image.shape[:2]
        image, transform = letterbox_image(image, self.input_size)
        if template is not None:
            template, _ = letterbox_image(template, self.input_size)
        companions = [letterbox_image(plane, self.input_size)[0] for plane in companions]
        prepared = (image, template, companions, transform, registration, (width, height))
        size = sum(plane.nbytes for plane in (image, template, *companions) if plane is not None)
        if self._cache_used + size <= self.cache_bytes:
            self._cache[index] = prepared
            self._cache_used += size
        elif self.cache_bytes and not self._cache_full_logged:
            self._cache_full_logged = True
            message = (
                "decoded-image cache full at %.0f MB (%d of %d samples); the rest are decoded every time"
            )
            logger.info(message, self._cache_used / 2**20, len(self._cache), len(self.samples))
        return prepared

    @property
    def cache_info(self) -> dict[str, int]:
        """Samples and bytes held by the decoded-image cache of this process."""
        return {"samples": len(self._cache), "bytes": self._cache_used, "budget_bytes": self.cache_bytes}

    def _read(self, path: Path) -> np.ndarray | None:
        try:
            return read_image(path, channels=self.channels, max_pixels=self.max_pixels)
        except (ImageReadError, cv2.error, OSError) as error:
            self._skip(str(path), error)
            return None

    def _read_planes(self, sample: Sample) -> tuple[np.ndarray, np.ndarray | None, list[np.ndarray]] | None:
        """(image, template or None, companions in `self.companions` order), or None when a file is unreadable."""
        if not self.use_template and not self.companions:
            image = self._read(sample.image_path)
            return None if image is None else (image, None, [])
        paths = [sample.image_path]
        if self.use_template:
            assert sample.template_path is not None
            paths.append(sample.template_path)
        paths += [sample.companion_paths[name] for name in self.companions]
        try:
            planes = read_planes(paths, channels=self.channels, max_pixels=self.max_pixels)
        except (ImageReadError, cv2.error, OSError) as error:
            # imageio's messages start with the path at fault
            at_fault = next(
                (str(p) for p in paths[1:] if str(error).startswith(f"{p}:")), str(sample.image_path)
            )
            self._skip(at_fault, error)
            return None
        template = planes[1] if self.use_template else None
        return planes[0], template, planes[1 + int(self.use_template) :]

    def _skip(self, name: str, error: Exception) -> None:
        if name not in self.skipped_paths:
            self.skipped_paths.append(name)
            logger.warning("skipping unreadable image %s: %s", name, error)

    def _match_size(
        self, plane: np.ndarray, image: np.ndarray, sample: Sample, kind: str, path: Path | None
    ) -> np.ndarray:
        """`plane` (a template or companion of `kind`) resized to its image when it differs (warned once a kind)."""
        if plane.shape[:2] == image.shape[:2]:
            return plane
        if kind not in self._warned_resize:
            self._warned_resize.add(kind)
            message = "%s %s is %dx%d but its image %s is %dx%d; resizing %s to their image (warned once)"
            (height, width), (image_height, image_width) = plane.shape[:2], image.shape[:2]
            planes = "templates" if kind == "template" else f"{kind} captures"
            logger.warning(
                message, kind, path, width, height, sample.image_path, image_width, image_height, planes
            )
        return cv2.resize(plane, (image.shape[1], image.shape[0]), interpolation=cv2.INTER_LINEAR)

    def _crop_origin(self, boxes: np.ndarray) -> tuple[int, int]:
        """Top-left of the crop window: usually one that contains a random box, else uniform."""
        assert self.crop_size is not None
        crop, limit = self.crop_size, self.input_size - self.crop_size
        rng = self._rng
        if len(boxes) and rng.random() < self.crop_defect_fraction:
            x1, y1, x2, y2 = boxes[int(rng.integers(len(boxes)))]
            return _origin_containing(x1, x2, crop, limit, rng), _origin_containing(y1, y2, crop, limit, rng)
        return int(rng.integers(0, limit + 1)), int(rng.integers(0, limit + 1))


def _origin_containing(low: float, high: float, crop: int, limit: int, rng: np.random.Generator) -> int:
    """A window start in [0, limit] whose `crop` window contains [low, high] when it fits, else centres it."""
    first, last = high - crop, low
    if first <= last:
        start = rng.uniform(first, last)
    else:  # the box is larger than the crop
        start = (low + high - crop) / 2
    return int(np.clip(round(start), 0, limit))


def to_input_tensor(
    image: np.ndarray,
    template: np.ndarray | None,
    dtype: torch.dtype = torch.float32,
    companions: Sequence[np.ndarray] = (),
) -> torch.Tensor:
    """Stack the tested image, its template and its companions (HxW or HxWx3 uint8) into one (C, H, W) tensor
    in [0, 1] (`data.planes`, the inference pipeline's very input), or raw uint8 with ``dtype=torch.uint8``."""
    if dtype == torch.uint8:
        return torch.from_numpy(stack_planes(image, template, companions))
    return torch.from_numpy(input_array(image, template, companions=companions))


def collate_detections(
    batch: list[Item | None],
    empty_shape: tuple[int, int, int] | None = None,
    empty_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, list[torch.Tensor], list[dict[str, Any]]]:
    """Stack a batch, dropping samples that failed to load (None).

    Returns images `[B, C, S, S]`, targets `list[Tensor[N, 5]]`, metas. When every sample failed the
    images tensor is empty, `[0, *empty_shape]` (`[0, 0, 0, 0]` without it): callers skip such a batch.
    """
    kept = [item for item in batch if item is not None]
    if not kept:
        return torch.zeros((0, *(empty_shape or (0, 0, 0))), dtype=empty_dtype), [], []
    images = torch.stack([item[0] for item in kept])  # (B, C, S, S)
    return images, [item[1] for item in kept], [item[2] for item in kept]
