"""Align a template to its tested image before the model compares them (NumPy + OpenCV only, no torch).

A second capture of a good board is never pixel-aligned with its template: a fixture or a conveyor leaves
a shift of a pixel or two and a fraction of a degree of rotation, and a template-aware model reads that as
a difference. `register_pair` measures the motion and warps the template onto the tested image:

1. both images are reduced to about `work_size` pixels on the long side (INTER_AREA);
2. phase correlation of a central crop (Hanning window) gives the translation;
3. ECC (`cv2.findTransformECC`, MOTION_EUCLIDEAN; MOTION_TRANSLATION with `rotation=False`), started from
   that translation, refines translation and rotation in a few iterations;
4. the motion is mapped back to full resolution and the template is warped once (bilinear, border
   replicated so the edge does not become a fake difference).

Bounded: a motion beyond `max_shift` pixels or `max_angle` degrees, a failed ECC, or a low ECC correlation
leaves the template untouched (`applied=False`; the measured motion is still reported), so a bad estimate
never makes things worse than no registration. A correction below `min_correction` pixels (largest displacement over the image) is not
applied either: resampling would blur the template for nothing.

The deployment runtime imports this module, so it must not import torch (a test checks).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import asdict, dataclass

import cv2
import numpy as np

DEFAULT_MAX_SHIFT = 8.0  # pixels of the tested image; larger motions are a fixture fault, not jitter
DEFAULT_MAX_ANGLE = 2.0  # degrees
DEFAULT_WORK_SIZE = 160  # long side of the images the motion is estimated on
DEFAULT_MIN_CORRELATION = 0.5  # ECC correlation coefficient below which the estimate is not trusted
DEFAULT_MIN_CORRECTION = 0.05  # pixels; smaller corrections are skipped (no resampling)
_ITERATIONS = 10  # Gauss-Newton / ECC iterations at most (3-6 from a phase-correlation start)
_EPSILON = 0.01  # stop when an update moves no pixel by more than this (reduced pixels)
_MARGIN = 4  # reduced pixels along the border left out of the fit (replicated after a warp)
METHODS = ("gauss_newton", "opencv_ecc")  # how the motion is refined after phase correlation


@dataclass(frozen=True)
class Registration:
    """The measured motion of the tested image relative to its template.

    The tested board is the template moved by (`dx`, `dy`) pixels (x right, y down, measured at the image
    centre) and rotated by `angle_deg` about the centre (OpenCV's sign: `cv2.getRotationMatrix2D`,
    positive is counter-clockwise on screen). `response`: phase-correlation peak (0..1); `correlation`:
    ECC correlation coefficient (NaN when ECC did not run); `applied`: whether the template was warped;
    `ms`: wall time of the whole call including the warp.
    """

    dx: float
    dy: float
    angle_deg: float
    response: float
    correlation: float
    applied: bool
    ms: float

    @property
    def shift(self) -> float:
        """Length of the translation, pixels."""
        return math.hypot(self.dx, self.dy)

    def to_dict(self) -> dict[str, float | bool]:
        return asdict(self)

    @classmethod
    def identity(cls, ms: float = 0.0) -> Registration:
        return cls(0.0, 0.0, 0.0, float("nan"), float("nan"), False, ms)


def motion_matrix(dx: float, dy: float, angle_deg: float, width: int, height: int) -> np.ndarray:
    """2x3 float64 forward motion in pixel-index coordinates: template pixel -> tested pixel."""
    centre = ((width - 1) / 2.0, (height - 1) / 2.0)
    matrix = cv2.getRotationMatrix2D(centre, angle_deg, 1.0)
    matrix[0, 2] += dx
    matrix[1, 2] += dy
    return matrix


def warp_to(image: np.ndarray, motion: np.ndarray) -> np.ndarray:
    """Apply a forward motion (`motion_matrix`) to `image`: bilinear, border replicated, same size."""
    height, width = image.shape[:2]
    return cv2.warpAffine(
        image, motion, (width, height), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
    )


@functools.lru_cache(maxsize=16)
def _hanning(width: int, height: int) -> np.ndarray:
    return cv2.createHanningWindow((width, height), cv2.CV_32F)


def _gray(image: np.ndarray) -> np.ndarray:
    if image.ndim == 3 and image.shape[2] == 3:
        return cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    if image.ndim == 3:
        return image[:, :, 0]
    return image


def _reduce(gray: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    if (gray.shape[1], gray.shape[0]) != size:
        gray = cv2.resize(gray, size, interpolation=cv2.INTER_AREA)
    return gray.astype(np.float32)


@dataclass(frozen=True)
class RegistrationSettings:
    """How `register_pair` measures a motion and when it applies it."""

    max_shift: float = DEFAULT_MAX_SHIFT  # pixels of the tested image; beyond: left untouched
    rotation: bool = True  # False: translation only
    max_angle: float = DEFAULT_MAX_ANGLE  # degrees; beyond: left untouched
    work_size: int = DEFAULT_WORK_SIZE  # long side of the reduced images the motion is measured on
    min_correlation: float = DEFAULT_MIN_CORRELATION  # a weaker fit is not trusted
    min_correction: float = DEFAULT_MIN_CORRECTION  # pixels; a smaller correction is not resampled
    method: str = "gauss_newton"  # or "opencv_ecc" (`cv2.findTransformECC`)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be 'gauss_newton' or 'opencv_ecc', got {self.method!r}")


_DEFAULT_SETTINGS = RegistrationSettings()


@dataclass(frozen=True)
class _ReducedPair:
    """Both images in gray float32 at the reduced size the motion is measured on."""

    tested: np.ndarray
    reference: np.ndarray
    size: tuple[int, int]  # (width, height)
    scale_x: float  # full pixels per reduced pixel
    scale_y: float

    @classmethod
    def of(cls, image: np.ndarray, template: np.ndarray, work_size: int) -> _ReducedPair:
        height, width = image.shape[:2]
        factor = max(1.0, max(width, height) / float(work_size))
        small = (max(8, round(width / factor)), max(8, round(height / factor)))
        tested, reference = _reduce(_gray(image), small), _reduce(_gray(template), small)
        return cls(tested, reference, small, width / small[0], height / small[1])


def register_pair(
    image: np.ndarray, template: np.ndarray, settings: RegistrationSettings | None = None
) -> tuple[np.ndarray, Registration]:
    """Warp `template` onto `image` (same HxW; gray or RGB, any dtype OpenCV warps) and say how it moved.

    Returns `(aligned_template, Registration)`; `aligned_template` is `template` itself (not a copy) when
    nothing was applied. Raises ValueError when the two sizes differ. `settings` (default:
    `RegistrationSettings()`) bound the motion; its `method` is "gauss_newton" (see `_refine_gauss_newton`) or
    "opencv_ecc" (`cv2.findTransformECC`, same criterion, slower here: bench/registration.py compares them).
    """
    started = time.perf_counter()
    settings = settings or _DEFAULT_SETTINGS
    height, width = image.shape[:2]
    if template.shape[:2] != (height, width):
        raise ValueError(
            f"template is {template.shape[1]}x{template.shape[0]} but the image is {width}x{height}"
        )
    pair = _ReducedPair.of(image, template, settings.work_size)
    shift_x, shift_y, response = _phase_shift(pair.tested, pair.reference, pair.size)
    if math.hypot(shift_x * pair.scale_x, shift_y * pair.scale_y) > settings.max_shift + 1.0:
        dx, dy = float(shift_x * pair.scale_x), float(shift_y * pair.scale_y)  # out of bounds: leave the pair
        return template, Registration(dx, dy, 0.0, float(response), float("nan"), False, _ms_since(started))

    # ECC refinement: warp maps tested (reduced) pixel -> template (reduced) pixel
    initial = np.array([[1.0, 0.0, -shift_x], [0.0, 1.0, -shift_y]], dtype=np.float32)
    refine = _refine_gauss_newton if settings.method == "gauss_newton" else _refine_opencv
    warp, correlation = refine(pair.tested, pair.reference, initial, settings.rotation)
    if warp is None:  # did not converge (e.g. a blank image)
        return template, Registration(0.0, 0.0, 0.0, float(response), float("nan"), False, _ms_since(started))

    dx, dy, angle, correlation = _checked_motion(warp, correlation, pair, settings.rotation, (width, height))
    applied = _worth_applying(dx, dy, angle, correlation, settings, (width, height))
    aligned = warp_to(template, motion_matrix(dx, dy, angle, width, height)) if applied else template
    ms = _ms_since(started)
    return aligned, Registration(
        float(dx), float(dy), float(angle), float(response), float(correlation), applied, ms
    )


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1e3


def _checked_motion(
    warp: np.ndarray, correlation: float, pair: _ReducedPair, rotation: bool, size: tuple[int, int]
) -> tuple[float, float, float, float]:
    """(dx, dy, angle, correlation) at full resolution; a motion that is not finite becomes none, its
    correlation NaN (never trusted)."""
    dx, dy, angle = _full_resolution_motion(warp, pair.scale_x, pair.scale_y, *size)
    if not rotation:
        angle = 0.0
    if not (math.isfinite(dx) and math.isfinite(dy) and math.isfinite(angle)):
        return 0.0, 0.0, 0.0, float("nan")
    return dx, dy, angle, correlation


def _worth_applying(
    dx: float,
    dy: float,
    angle: float,
    correlation: float,
    settings: RegistrationSettings,
    size: tuple[int, int],
) -> bool:
    """Within the bounds, a trusted fit, and a correction of at least `min_correction` pixels somewhere."""
    shift = math.hypot(dx, dy)
    trusted = (
        shift <= settings.max_shift
        and abs(angle) <= settings.max_angle
        and correlation >= settings.min_correlation
    )
    # largest displacement the correction causes anywhere in the image
    reach = shift + math.radians(abs(angle)) * math.hypot(*size) / 2
    return trusted and reach >= settings.min_correction


def _phase_shift(
    tested: np.ndarray, reference: np.ndarray, small: tuple[int, int]
) -> tuple[float, float, float]:
    """Translation (reduced pixels, 0 when undefined) and response of phase correlation on a central crop
    (the Hanning window tapers its edges)."""
    crop_w, crop_h = max(8, (small[0] * 4 // 5) & ~1), max(8, (small[1] * 4 // 5) & ~1)
    x0, y0 = (small[0] - crop_w) // 2, (small[1] - crop_h) // 2
    (shift_x, shift_y), response = cv2.phaseCorrelate(
        reference[y0 : y0 + crop_h, x0 : x0 + crop_w],
        tested[y0 : y0 + crop_h, x0 : x0 + crop_w],
        _hanning(crop_w, crop_h),
    )
    if not (math.isfinite(shift_x) and math.isfinite(shift_y)):
        shift_x = shift_y = 0.0
    return shift_x, shift_y, response


def _full_resolution_motion(
    warp: np.ndarray, scale_x: float, scale_y: float, width: int, height: int
) -> tuple[float, float, float]:
    """The reduced-resolution warp (tested -> template pixel) as the template's motion at full resolution:
    (dx, dy) of the image centre and the angle in degrees. Full index = scale * (reduced index + 0.5) - 0.5."""
    scale = np.diag([scale_x, scale_y])
    offset = np.array([0.5 * scale_x - 0.5, 0.5 * scale_y - 0.5])
    linear_small = warp[:, :2].astype(np.float64)
    linear = scale @ linear_small @ np.linalg.inv(scale)
    translation = scale @ (linear_small @ (-np.linalg.inv(scale) @ offset) + warp[:, 2]) + offset
    inverse = np.hstack([linear, translation[:, None]])  # tested pixel -> template pixel
    forward = cv2.invertAffineTransform(inverse)  # template pixel -> tested pixel
    centre = np.array([(width - 1) / 2.0, (height - 1) / 2.0])
    dx, dy = forward[:, :2] @ centre + forward[:, 2] - centre
    angle = math.degrees(math.atan2(forward[0, 1], forward[0, 0]))
    return dx, dy, angle


def _refine_opencv(
    tested: np.ndarray, reference: np.ndarray, initial: np.ndarray, rotation: bool
) -> tuple[np.ndarray | None, float]:
    motion_type = cv2.MOTION_EUCLIDEAN if rotation else cv2.MOTION_TRANSLATION
    criteria = (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, _ITERATIONS, _EPSILON / 10)
    try:
        correlation, warp = cv2.findTransformECC(
            tested, reference, initial.copy(), motion_type, criteria, None, 1
        )
    except cv2.error:
        return None, float("nan")
    return warp, float(correlation)


@functools.lru_cache(maxsize=8)
def _grid(width: int, height: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centred x and y coordinates (flattened) and a 0/1 weight that drops a `_MARGIN` border."""
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    weight = np.zeros((height, width), np.float32)
    weight[_MARGIN : height - _MARGIN, _MARGIN : width - _MARGIN] = 1.0
    return (xs - (width - 1) / 2.0).ravel(), (ys - (height - 1) / 2.0).ravel(), weight


def _mean_std(values: np.ndarray) -> tuple[float, float]:
    mean, std = cv2.meanStdDev(values)
    return float(mean[0, 0]), float(std[0, 0]) + 1e-6


def _euclidean(theta: float, tx: float, ty: float, width: int, height: int) -> np.ndarray:
    """W(x) = R(theta) (x - c) + c + t as a 2x3 float32 matrix (reduced pixels)."""
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    cos, sin = math.cos(theta), math.sin(theta)
    return np.array(
        [[cos, -sin, cx - cos * cx + sin * cy + tx], [sin, cos, cy - sin * cx - cos * cy + ty]], np.float32
    )


def _refine_gauss_newton(
    tested: np.ndarray, reference: np.ndarray, initial: np.ndarray, rotation: bool
) -> tuple[np.ndarray | None, float]:
    """Maximise the ECC criterion (correlation of zero-mean, unit-variance images) over a rigid motion
    by inverse-compositional Gauss-Newton: the tested image's gradients, steepest-descent images and
    Hessian are computed once; an iteration is one small warp, its mean/std and one matrix-vector product
    (standardising the warped image is folded into that product). `cv2.findTransformECC` recomputes
    warped gradients and the Hessian every iteration.
    """
    height, width = tested.shape
    mean, std = _mean_std(tested)
    fixed = (tested - np.float32(mean)) * np.float32(1.0 / std)  # (H, W) standardised
    xs, ys, weight = _grid(width, height)
    grad_x = (cv2.Sobel(fixed, cv2.CV_32F, 1, 0, ksize=3, scale=0.125) * weight).ravel()
    grad_y = (cv2.Sobel(fixed, cv2.CV_32F, 0, 1, ksize=3, scale=0.125) * weight).ravel()
    steepest = np.empty((3 if rotation else 2, grad_x.size), np.float32)  # (P, N), border rows are 0
    steepest[-2], steepest[-1] = grad_x, grad_y
    if rotation:
        steepest[0] = grad_y * xs - grad_x * ys
    hessian = (steepest @ steepest.T).astype(np.float64)  # (P, P)
    determinant = np.linalg.det(hessian)
    if not np.isfinite(hessian).all() or determinant <= 1e-12 * np.prod(np.diag(hessian)) or determinant <= 0:
        return None, float("nan")  # no texture: the motion is not observable
    hessian_inverse = np.linalg.inv(hessian).astype(np.float32)
    fixed_values = fixed.ravel()
    steepest_fixed = steepest @ fixed_values  # (P,)
    steepest_sums = steepest.sum(axis=1)  # (P,)
    reach = max(width, height) / 2.0
    theta = 0.0
    tx, ty = float(initial[0, 2]), float(initial[1, 2])  # initial holds a pure translation: W(x) = x + t
    warped = reference
    for _ in range(_ITERATIONS):
        warped = cv2.warpAffine(
            reference,
            _euclidean(theta, tx, ty, width, height),
            (width, height),
            flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
            borderMode=cv2.BORDER_REPLICATE,
        )
        warped_mean, warped_std = _mean_std(warped)
        # steepest @ (standardised(warped) - fixed), without forming standardised(warped)
        projected = (steepest @ warped.ravel() - warped_mean * steepest_sums) / warped_std - steepest_fixed
        update = hessian_inverse @ projected
        d_theta = float(update[0]) if rotation else 0.0
        d_tx, d_ty = float(update[-2]), float(update[-1])
        if not (math.isfinite(d_theta) and math.isfinite(d_tx) and math.isfinite(d_ty)):
            return None, float("nan")
        # W <- W o dW^-1 with dW(x) = R(d_theta)(x - c) + c + dt
        theta -= d_theta
        cos, sin = math.cos(theta), math.sin(theta)
        tx -= cos * d_tx - sin * d_ty
        ty -= sin * d_tx + cos * d_ty
        if math.hypot(d_tx, d_ty) + abs(d_theta) * reach < _EPSILON:
            break
    warped_mean, warped_std = _mean_std(warped)
    correlation = float(np.dot(warped.ravel(), fixed_values)) / (warped_std * fixed_values.size)
    return _euclidean(theta, tx, ty, width, height), correlation
