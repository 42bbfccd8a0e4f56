"""The torch Dataset and its collate function (the DataLoader factory is `engine.loader.build_loader`).

An item is `(image Tensor[C,S,S] float32 in [0,1], target Tensor[N,5] (class, x1, y1, x2, y2) in the tensor's
pixels, meta dict)`, or `None` when the image could not be read: a bad file never stops an epoch.
`collate_detections` drops those `None`s.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from defectdet.data.augment import AugmentConfig, build_augment, clip_boxes_to_window
from defectdet.data.imageio import DEFAULT_MAX_PIXELS, read_image, read_pair
from defectdet.data.letterbox import boxes_to_letterbox, letterbox_image
from defectdet.data.planes import input_array, stack_planes
from defectdet.data.registration import register_pair
from defectdet.data.sample import DatasetSplit, Sample
from defectdet.errors import DatasetError, ImageReadError

logger = logging.getLogger(__name__)

Item = tuple[torch.Tensor, torch.Tensor, dict[str, Any]]


class DetectionDataset(Dataset):
    """Samples of a `DatasetSplit` as model-ready tensors.

    Pipeline per item: read the tested image (+ template) at `channels` -> letterbox both to `imgsz`
    -> (train) augment -> (train, `crop_size < imgsz`) a `crop_size` window, biased towards defects
    -> tensor `[C, S, S]`, C = channels (x2 with a template; order [tested, template]).

    `use_template=None` uses templates when every sample has one. `augment=None` means no augmentation;
    augmentation and cropping only happen with `train=True`.

    `image_dtype=torch.uint8` returns raw 0..255 images instead of float32 0..1 (the caller then does
    `images.float().div_(255)`, ideally on the device): 4x less data through worker IPC and no float
    copies in the loader (throughput per dtype: bench/results/loader.json).

    Randomness (crop window, augmentation) is drawn from generators derived from `(seed, epoch, index)`
    when the index carries its epoch (`engine.loader.SampleIndex`, what `build_loader` yields): an item is
    then a pure function of those three, in this process or any loader worker, before or after a resume.
    A plain int index (`dataset[i]`) draws from a per-instance stream instead (`reseed` restarts it), so
    repeated calls still vary. A tested image and its template share one intensity mapping (`read_pair`).

    Unreadable images are skipped: a warning names the file once and `__getitem__` returns None.
    `skipped_paths` lists them, but only for reads done in this process: with loader workers each worker
    has its own copy of the dataset, logs its own warnings and keeps its own `skipped_paths`.
    """

    def __init__(
        self,
        split: DatasetSplit,
        imgsz: int = 640,
        channels: int = 1,
        use_template: bool | None = None,
        augment: AugmentConfig | None = None,
        train: bool = False,
        crop_size: int | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        crop_defect_fraction: float = 0.8,
        seed: int = 0,
        image_dtype: torch.dtype = torch.float32,
        register_pairs: bool = True,
        cache_bytes: int = 0,
    ) -> None:
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 (gray) or 3 (RGB), got {channels}")
        if imgsz <= 0:
            raise ValueError(f"imgsz must be positive, got {imgsz}")
        if image_dtype not in (torch.float32, torch.uint8):
            raise ValueError(f"image_dtype must be torch.float32 or torch.uint8, got {image_dtype}")
        if crop_size is not None and crop_size <= 0:
            raise ValueError(f"crop_size must be positive, got {crop_size}")
        self.split = split
        self.samples: list[Sample] = list(split.samples)
        self.imgsz = imgsz
        self.channels = channels
        self.use_template = self._resolve_use_template(use_template)
        self.register_pairs = register_pairs and self.use_template  # data.registration, before letterbox
        self.train = train
        self.crop_size = crop_size if train and crop_size is not None and crop_size < imgsz else None
        self.max_pixels = max_pixels
        self.image_dtype = image_dtype
        self.crop_defect_fraction = crop_defect_fraction
        config = augment or AugmentConfig(enabled=False)
        self.min_visibility = config.min_visibility
        self.seed = seed
        self.augmenter = build_augment(config, train=train and augment is not None, seed=seed)
        self.skipped_paths: list[str] = []
        self._warned_template_resize = False
        self._unkeyed = np.random.default_rng(seed)  # draws for plain int indices
        self._rng = np.random.default_rng(seed)
        # decoded, registered and letterboxed pairs (everything before the random draws), up to a budget
        self.cache_bytes = max(0, int(cache_bytes))
        self._cache: dict[int, tuple] = {}
        self._cache_used = 0
        self._cache_full_logged = False
        if self.cache_bytes:
            per_sample = imgsz * imgsz * channels * (2 if self.use_template else 1)
            logger.info(
                "decoded-image cache: up to %.0f MB per loading process, about %d of %d samples",
                self.cache_bytes / 2**20, min(len(self.samples), self.cache_bytes // per_sample), len(self.samples),
            )  # fmt: skip

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
        return self.channels * (2 if self.use_template else 1)

    @property
    def output_size(self) -> int:
        return self.crop_size or self.imgsz

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
        image, template, transform, registration, (width, height) = prepared
        if self.augmenter.active:  # the augmenter may write into its inputs: keep the cached arrays intact
            image = image.copy()
            template = None if template is None else template.copy()
        boxes = boxes_to_letterbox(sample.boxes, transform)
        classes = sample.classes

        image, template, boxes, classes = self.augmenter(image, template, boxes, classes)
        size = self.imgsz
        offset_x = offset_y = 0
        if self.crop_size is not None:
            size = self.crop_size
            offset_x, offset_y = self._crop_origin(boxes)
            image = image[offset_y : offset_y + size, offset_x : offset_x + size]
            if template is not None:
                template = template[offset_y : offset_y + size, offset_x : offset_x + size]
            window = (offset_x, offset_y, offset_x + size, offset_y + size)
            boxes, classes = clip_boxes_to_window(boxes, classes, window, self.min_visibility)
        else:
            # drop labels outside the canvas or empty; keep what the augmenter already filtered
            boxes, classes = clip_boxes_to_window(boxes, classes, (0, 0, size, size), 0.0)

        tensor = to_input_tensor(image, template, self.image_dtype)  # (C, S, S)
        target = torch.from_numpy(
            np.concatenate([classes[:, None].astype(np.float32), boxes], axis=1)
        )  # (N, 5)
        meta = {
            "image_id": sample.image_id,
            "image_path": str(sample.image_path),
            "template_path": None if sample.template_path is None else str(sample.template_path),
            "transform": transform,
            "orig_size": (width, height),
            "crop_offset": (offset_x, offset_y),
            "registration": None if registration is None else registration.to_dict(),
        }
        return tensor, target, meta

    def _prepare(self, index: int, sample: Sample) -> tuple | None:
        """Decode (one intensity mapping per pair), register and letterbox one sample: the deterministic part
        of an item, kept in the cache while it fits in ``cache_bytes``."""
        template = None
        registration = None
        if self.use_template:
            assert sample.template_path is not None
            pair = self._read_pair(sample)
            if pair is None:
                return None
            image, template = pair
            template = self._match_size(template, image, sample)
            if self.register_pairs:
                template, registration = register_pair(image, template)
        else:
            image = self._read(sample.image_path)
            if image is None:
                return None
        height, width = image.shape[:2]
        image, transform = letterbox_image(image, self.imgsz)
        if template is not None:
            template, _ = letterbox_image(template, self.imgsz)
        prepared = (image, template, transform, registration, (width, height))
        size = image.nbytes + (0 if template is None else template.nbytes)
        if self._cache_used + size <= self.cache_bytes:
            self._cache[index] = prepared
            self._cache_used += size
        elif self.cache_bytes and not self._cache_full_logged:
            self._cache_full_logged = True
            logger.info(
                "decoded-image cache full at %.0f MB (%d of %d samples); the rest are decoded every time",
                self._cache_used / 2**20, len(self._cache), len(self.samples),
            )  # fmt: skip
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

    def _read_pair(self, sample: Sample) -> tuple[np.ndarray, np.ndarray] | None:
        assert sample.template_path is not None
        try:
            return read_pair(
                sample.image_path, sample.template_path, channels=self.channels, max_pixels=self.max_pixels
            )
        except (ImageReadError, cv2.error, OSError) as error:
            # imageio's messages start with the path at fault
            template = str(sample.template_path)
            self._skip(template if str(error).startswith(f"{template}:") else str(sample.image_path), error)
            return None

    def _skip(self, name: str, error: Exception) -> None:
        if name not in self.skipped_paths:
            self.skipped_paths.append(name)
            logger.warning("skipping unreadable image %s: %s", name, error)

    def _match_size(self, template: np.ndarray, image: np.ndarray, sample: Sample) -> np.ndarray:
        if template.shape[:2] == image.shape[:2]:
            return template
        if not self._warned_template_resize:
            self._warned_template_resize = True
            logger.warning(
                "template %s is %dx%d but its image %s is %dx%d; resizing templates to their image "
                "(warned once)",
                sample.template_path,
                template.shape[1],
                template.shape[0],
                sample.image_path,
                image.shape[1],
                image.shape[0],
            )
        return cv2.resize(template, (image.shape[1], image.shape[0]), interpolation=cv2.INTER_LINEAR)

    def _crop_origin(self, boxes: np.ndarray) -> tuple[int, int]:
        """Top-left of the crop window: usually one that contains a random box, else uniform."""
        assert self.crop_size is not None
        crop, limit = self.crop_size, self.imgsz - self.crop_size
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
    image: np.ndarray, template: np.ndarray | None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Stack the tested image and its template (HxW or HxWx3 uint8) into one (C, H, W) tensor in [0, 1]
    (`data.planes`, the inference pipeline's very input), or raw uint8 with ``dtype=torch.uint8``."""
    if dtype == torch.uint8:
        return torch.from_numpy(stack_planes(image, template))
    return torch.from_numpy(input_array(image, template))


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
