"""The model input from uint8 canvases: planes stacked as channels ``[tested, template, *companions]``, scaled
to [0, 1].

NumPy only (no torch, no OpenCV): the training dataset (`trainingdata.dataset.to_input_tensor`) and the one inference
pipeline (`runtime.pipeline`, which `engine.predict` and `runtime.predictor` share) build every input here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

INPUT_SCALE = 1.0 / 255.0  # uint8 pixel -> graph input; mean and std are applied inside the model


def stack_planes(
    image: np.ndarray, template: np.ndarray | None, companions: Sequence[np.ndarray] = ()
) -> np.ndarray:
    """HxW or HxWxc uint8 image (and template, and companion captures in the model's order) -> ``(C, H, W)``
    uint8: the tested image's channels first, then the template's, then each companion's."""
    planes = [image, *([] if template is None else [template]), *companions]
    for plane in planes[1:]:
        if plane.shape != image.shape:
            raise ValueError(f"plane shape {plane.shape} differs from the image's {image.shape}")
    chw = [plane[None] if plane.ndim == 2 else plane.transpose(2, 0, 1) for plane in planes]
    return np.concatenate(chw, axis=0)


def input_array(
    image: np.ndarray,
    template: np.ndarray | None,
    scale: float = INPUT_SCALE,
    companions: Sequence[np.ndarray] = (),
) -> np.ndarray:
    """`stack_planes` times `scale` as float32 ``(C, H, W)`` (single-threaded NumPy: a cast this small gains
    nothing from torch's intra-op threads, which would only contend with the trainer)."""
    return np.multiply(stack_planes(image, template, companions), np.float32(scale), dtype=np.float32)
