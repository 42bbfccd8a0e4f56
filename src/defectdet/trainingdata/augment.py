"""Box-aware training augmentation for a tested image and its (optional) aligned template and companion captures.

Geometry (flips, rotate/scale/translate) is sampled once as one affine matrix and applied with the same
`cv2.warpAffine` call to the tested image, the template, every companion and the boxes, so the planes stay
pixel-aligned by construction (up to the small pair jitter the template and each companion get on their own).
Photometric changes (brightness, contrast, gamma, blur, noise) are sampled independently for each plane because
the planes come from different exposures; simulated glare touches the tested image only.

Why not albumentations for the geometry: its Compose with bbox bookkeeping and `additional_targets`
adds more Python time than the two warps it wraps cost, and flips followed by an Affine warp twice.
Brightness/contrast/gamma and blur use albumentations (>= 2.0 API). Noise is a window of a precomputed
normal bank instead of fresh Gaussian draws per image (albumentations' GaussNoise), which cost far more.
(No timings are quoted here: the loader's per-stage costs are in bench/results/loader.json.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import albumentations as A
import cv2
import numpy as np

from defectdet.trainingdata.augment_config import AugmentConfig

__all__ = ["AugmentConfig", "Augmenter", "build_augment", "clip_boxes_to_window", "transform_boxes"]


def clip_boxes_to_window(
    boxes: np.ndarray,
    classes: np.ndarray,
    window: tuple[float, float, float, float],
    min_visibility: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Clip xyxy boxes to `window` (x1, y1, x2, y2), drop those with less than `min_visibility` of
    their area inside it (and empty ones), and shift them to window coordinates.

    Returns float32 (M, 4) and int64 (M,).
    """
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    classes = np.asarray(classes, dtype=np.int64).reshape(-1)
    x1, y1, x2, y2 = window
    clipped = boxes.copy()
    clipped[:, [0, 2]] = clipped[:, [0, 2]].clip(x1, x2)
    clipped[:, [1, 3]] = clipped[:, [1, 3]].clip(y1, y2)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    widths = clipped[:, 2] - clipped[:, 0]
    heights = clipped[:, 3] - clipped[:, 1]
    visible = widths * heights
    keep = (widths > 0) & (heights > 0) & (visible >= min_visibility * np.maximum(area, 1e-6))
    clipped = clipped[keep] - np.array([x1, y1, x1, y1], dtype=np.float32)
    return clipped.astype(np.float32), classes[keep]


def transform_boxes(boxes: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Map xyxy boxes through a 2x3 affine matrix; returns the boxes enclosing the mapped corners."""
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    corners = boxes[:, [0, 1, 2, 1, 0, 3, 2, 3]].reshape(-1, 4, 2)  # (N, 4, 2)
    mapped = corners @ matrix[:, :2].T.astype(np.float32) + matrix[:, 2].astype(np.float32)  # (N, 4, 2)
    return np.concatenate([mapped.min(axis=1), mapped.max(axis=1)], axis=1).astype(np.float32)


class Augmenter:
    """Callable `(image, template | None, boxes, classes) -> (image, template, boxes, classes)`; `augment` also
    takes the companion captures.

    Images are uint8 HxW or HxWx3; boxes float xyxy pixels. Returns float32 (N, 4) boxes and int64 (N,)
    classes; N may drop to 0. With `active=False` it only normalises dtypes (validation / disabled).
    Randomness is private to the instance; `reseed` restarts it. The dataset reseeds it for every sample
    from (seed, epoch, index), so a draw never depends on what ran before (exact resume, any worker count).
    """

    def __init__(self, config: AugmentConfig, active: bool = True, seed: int = 0) -> None:
        self.config = config
        self.active = active and config.enabled
        self._noise_bank: np.ndarray | None = None
        self._bank_seed = seed  # the noise bank depends on the construction seed only (see `_bank`)
        self._photometric_companions: list[
            A.Compose | None
        ] = []  # one per companion position, made on first use
        if self.active:
            self._photometric_image = self._build_photometric(config)
            self._photometric_template = self._build_photometric(config)
        self.reseed(seed)

    def reseed(self, seed: int) -> None:
        """Restart every random stream from `seed` (independent streams derived from it). Cheap enough to
        call per sample: the noise bank, a fixed table the noise windows are cut from, is kept."""
        self._seed = seed
        streams = np.random.SeedSequence(seed).generate_state(3 + len(self._photometric_companions))
        self._rng = np.random.default_rng(int(streams[0]))
        # the companions' jitter and noise: their own stream, so the image's and template's draws do not move
        self._companion_rng = np.random.default_rng([seed, 1])
        if self.active:
            composes = [self._photometric_image, self._photometric_template, *self._photometric_companions]
            for photometric, stream in zip(composes, streams[1:], strict=True):
                if photometric is not None:
                    photometric.set_random_seed(int(stream))

    @staticmethod
    def _build_photometric(config: AugmentConfig) -> A.Compose | None:
        transforms: list[Any] = []
        if config.brightness_contrast_prob > 0 and (config.brightness > 0 or config.contrast > 0):
            transforms.append(
                A.RandomBrightnessContrast(
                    brightness_limit=config.brightness,
                    contrast_limit=config.contrast,
                    p=config.brightness_contrast_prob,
                )
            )
        if config.gamma_prob > 0 and config.gamma != (1.0, 1.0):
            low, high = config.gamma
            transforms.append(A.RandomGamma(gamma_limit=(low * 100, high * 100), p=config.gamma_prob))
        if config.blur_prob > 0:
            largest = config.blur_max_kernel | 1  # odd
            transforms.append(
                A.OneOf(
                    [
                        A.GaussianBlur(blur_limit=(3, largest), p=1.0),
                        A.MotionBlur(blur_limit=(3, largest), p=1.0),
                    ],
                    p=config.blur_prob,
                )
            )
        return A.Compose(transforms) if transforms else None

    def __call__(
        self,
        image: np.ndarray,
        template: np.ndarray | None,
        boxes: np.ndarray,
        classes: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
        image, template, _, boxes, classes = self.augment(image, template, (), boxes, classes)
        return image, template, boxes, classes

    def augment(
        self,
        image: np.ndarray,
        template: np.ndarray | None,
        companions: Sequence[np.ndarray],
        boxes: np.ndarray,
        classes: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray | None, list[np.ndarray], np.ndarray, np.ndarray]:
        """`(image, template, companions, boxes, classes)` augmented: one geometry for every plane and the boxes,
        the pair jitter drawn apart for the template and each companion, photometric changes per plane."""
        boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
        classes = np.asarray(classes, dtype=np.int64).reshape(-1)
        if not self.active:
            return image, template, list(companions), boxes, classes
        for name, plane in (("template", template), *(("companion", plane) for plane in companions)):
            if plane is not None and plane.shape != image.shape:
                raise ValueError(f"{name} shape {plane.shape} differs from image shape {image.shape}")

        height, width = image.shape[:2]
        # labels sticking out of the image are clipped first (not judged by visibility), empty ones dropped
        boxes, classes = clip_boxes_to_window(boxes, classes, (0, 0, width, height), 0.0)
        matrix = self._sample_geometry(width, height)
        template_matrix = matrix
        if template is not None:
            template_matrix = self._jitter_pair(matrix, width, height)
        companion_matrices = [
            self._jitter_pair(matrix, width, height, self._companion_rng) for _ in companions
        ]
        if matrix is not None:
            image = self._warp(image, matrix)
            boxes = transform_boxes(boxes, matrix)
            boxes, classes = clip_boxes_to_window(
                boxes, classes, (0, 0, width, height), self.config.min_visibility
            )
        if template is not None and template_matrix is not None:
            template = self._warp(template, template_matrix)
        warped = [
            plane if plane_matrix is None else self._warp(plane, plane_matrix)
            for plane, plane_matrix in zip(companions, companion_matrices, strict=True)
        ]

        image = self._photometric(self._photometric_image, image)
        image = self._maybe_glare(image)
        if template is not None:
            template = self._photometric(self._photometric_template, template)
        warped = [
            self._photometric(self._companion_photometric(i), plane, self._companion_rng)
            for i, plane in enumerate(warped)
        ]
        return (
            np.ascontiguousarray(image),
            None if template is None else np.ascontiguousarray(template),
            [np.ascontiguousarray(plane) for plane in warped],
            boxes,
            classes,
        )

    def _companion_photometric(self, position: int) -> A.Compose | None:
        """The photometric changes of the companion at `position`, with its own random stream (made on first
        use and seeded from the current seed, so a draw does not depend on when it was made)."""
        while len(self._photometric_companions) <= position:
            compose = self._build_photometric(self.config)
            index = 3 + len(self._photometric_companions)
            if compose is not None:
                compose.set_random_seed(
                    int(np.random.SeedSequence(self._seed).generate_state(index + 1)[index])
                )
            self._photometric_companions.append(compose)
        return self._photometric_companions[position]

    def _photometric(
        self, compose: A.Compose | None, image: np.ndarray, rng: np.random.Generator | None = None
    ) -> np.ndarray:
        if compose is not None:
            image = compose(image=image)["image"]
        return self._maybe_noise(image, rng)

    def _sample_geometry(self, width: int, height: int) -> np.ndarray | None:
        """A random 2x3 affine matrix in continuous pixel coordinates (pixel i spans [i, i+1)):
        flips about the centre, then rotation + scale about the centre, then translation.
        None when the draw is the identity."""
        config, rng = self.config, self._rng
        flip_x = rng.random() < config.horizontal_flip
        flip_y = rng.random() < config.vertical_flip
        angle = np.deg2rad(rng.uniform(-config.rotate_degrees, config.rotate_degrees))
        scale = rng.uniform(*config.scale)
        shift_x = rng.uniform(-config.translate, config.translate) * width
        shift_y = rng.uniform(-config.translate, config.translate) * height
        if not (flip_x or flip_y) and angle == 0 and scale == 1 and shift_x == 0 and shift_y == 0:
            return None
        centre = np.array([width / 2, height / 2])
        flip = np.diag([-1.0 if flip_x else 1.0, -1.0 if flip_y else 1.0])
        cos, sin = np.cos(angle) * scale, np.sin(angle) * scale
        rotate_scale = np.array([[cos, -sin], [sin, cos]])
        linear = rotate_scale @ flip  # (2, 2)
        offset = centre + np.array([shift_x, shift_y]) - linear @ centre  # p' = linear @ p + offset
        return np.hstack([linear, offset[:, None]])

    def _jitter_pair(
        self, matrix: np.ndarray | None, width: int, height: int, rng: np.random.Generator | None = None
    ) -> np.ndarray | None:
        """The template's matrix: the shared one followed by a small random relative motion about the
        centre (`pair_shift`, `pair_rotate_degrees`), drawn with probability `pair_jitter_prob`."""
        config, rng = self.config, rng or self._rng
        if config.pair_jitter_prob <= 0 or (config.pair_shift <= 0 and config.pair_rotate_degrees <= 0):
            return matrix
        if rng.random() >= config.pair_jitter_prob:
            return matrix
        shift_x, shift_y = rng.uniform(-config.pair_shift, config.pair_shift, 2)
        angle = np.deg2rad(rng.uniform(-config.pair_rotate_degrees, config.pair_rotate_degrees))
        centre = np.array([width / 2, height / 2])
        rotate = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        relative = np.hstack([rotate, (centre + np.array([shift_x, shift_y]) - rotate @ centre)[:, None]])
        base = np.vstack([matrix if matrix is not None else np.eye(2, 3), [0.0, 0.0, 1.0]])
        return relative @ base  # (2, 3)

    def _warp(self, image: np.ndarray, matrix: np.ndarray) -> np.ndarray:
        height, width = image.shape[:2]
        # cv2 addresses pixel centres by integer index: index = continuous coordinate - 0.5
        linear, offset = matrix[:, :2], matrix[:, 2]
        index_matrix = np.hstack([linear, (offset + linear @ np.array([0.5, 0.5]) - 0.5)[:, None]])
        fill = (self.config.fill_value,) * (image.shape[2] if image.ndim == 3 else 1)
        return cv2.warpAffine(
            image,
            index_matrix,
            (width, height),
            flags=cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_CONSTANT,
            borderValue=fill,
        )

    def _maybe_noise(self, image: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        config, rng = self.config, rng or self._rng
        if config.noise_prob <= 0 or rng.random() >= config.noise_prob:
            return image
        height, width = image.shape[:2]
        channels = image.shape[2] if image.ndim == 3 else 1
        bank = self._bank(height, width * channels)
        top = int(rng.integers(0, bank.shape[0] - height + 1))
        left = int(rng.integers(0, bank.shape[1] - width * channels + 1))
        noise = bank[top : top + height, left : left + width * channels].reshape(image.shape)
        std = float(rng.uniform(*config.noise_std))
        return cv2.addWeighted(image, 1.0, noise, std, 0.0, dtype=cv2.CV_8U)

    def _bank(self, height: int, width: int) -> np.ndarray:
        """A standard-normal float32 bank at least 1.5x the request; windows of it are the noise."""
        bank = self._noise_bank
        if bank is None or bank.shape[0] < height or bank.shape[1] < width:
            shape = (int(height * 1.5) + 1, int(width * 1.5) + 1)
            generator = np.random.default_rng([self._bank_seed, *shape])  # same request, same bank
            bank = generator.standard_normal(shape, dtype=np.float32)
            self._noise_bank = bank
        return bank

    def _maybe_glare(self, image: np.ndarray) -> np.ndarray:
        """Add a soft bright elliptical blob (specular highlight), saturating at 255."""
        config = self.config
        if config.glare_prob <= 0 or self._rng.random() >= config.glare_prob:
            return image
        height, width = image.shape[:2]
        rng = self._rng
        short_side = min(height, width)
        axis_a = rng.uniform(*config.glare_radius) * short_side
        axis_b = axis_a * rng.uniform(0.4, 1.0)
        angle = rng.uniform(0, np.pi)
        centre_x, centre_y = rng.uniform(0, width), rng.uniform(0, height)
        peak = rng.uniform(*config.glare_intensity)
        reach = 2.5 * axis_a  # the blob is ~0 beyond 2.5 sigma; only compute inside that square
        x0, x1 = int(max(0, centre_x - reach)), int(min(width, centre_x + reach + 1))
        y0, y1 = int(max(0, centre_y - reach)), int(min(height, centre_y + reach + 1))
        if x1 <= x0 or y1 <= y0:
            return image
        xs = np.arange(x0, x1, dtype=np.float32)[None, :] - np.float32(centre_x)  # (1, w)
        ys = np.arange(y0, y1, dtype=np.float32)[:, None] - np.float32(centre_y)  # (h, 1)
        cos, sin = np.float32(np.cos(angle)), np.float32(np.sin(angle))
        u = (xs * cos + ys * sin) / np.float32(axis_a)
        v = (-xs * sin + ys * cos) / np.float32(axis_b)
        blob = np.exp(-0.5 * (u * u + v * v)) * np.float32(peak)  # (h, w) float32
        if image.ndim == 3:
            blob = np.repeat(blob[:, :, None], image.shape[2], axis=2)
        image = image.copy()
        region = image[y0:y1, x0:x1]
        image[y0:y1, x0:x1] = cv2.add(region, blob, dtype=cv2.CV_8U).reshape(region.shape)
        return image


def build_augment(config: AugmentConfig | None, train: bool = True, seed: int = 0) -> Augmenter:
    """The augmenter for training (`train=True`) or a pass-through one for evaluation / `config=None`."""
    config = config or AugmentConfig()
    return Augmenter(config, active=train and config.enabled, seed=seed)
