"""`AugmentConfig`, the training augmentation settings, apart from the augmentation itself (`trainingdata.augment`)
so that reading a training configuration imports neither albumentations nor torch."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class AugmentConfig(BaseModel):
    """Training augmentation settings; the one source of their defaults."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True  # False: no augmentation at all
    # geometry, shared by tested image, template and boxes
    rotate_degrees: float = Field(5.0, ge=0.0, le=180.0)  # largest rotation, degrees
    scale: tuple[float, float] = (0.9, 1.1)  # random zoom range
    translate: float = Field(0.05, ge=0.0, le=0.5)  # fraction of the image side
    horizontal_flip: float = Field(0.5, ge=0.0, le=1.0)  # probability
    vertical_flip: float = Field(0.5, ge=0.0, le=1.0)  # probability
    fill_value: int = Field(114, ge=0, le=255)  # matches the letterbox padding
    # residual misregistration of the pair: the template (and each companion, drawn apart) moves by up to
    # `pair_shift` pixels per axis (of the letterboxed input) and `pair_rotate_degrees`, so the model does not
    # read a pixel of misalignment as a defect (registration leaves ~0.1 px, DeepPCB pairs differ by 0.5 px median)
    pair_shift: float = Field(1.0, ge=0.0, le=16.0)
    pair_rotate_degrees: float = Field(0.1, ge=0.0, le=5.0)  # the template's extra rotation, at most
    pair_jitter_prob: float = Field(0.5, ge=0.0, le=1.0)  # probability of moving the template
    # photometric, independent per image
    brightness: float = Field(0.2, ge=0.0, le=1.0)  # +- fraction of full range
    contrast: float = Field(0.2, ge=0.0, le=1.0)  # +- fraction
    brightness_contrast_prob: float = Field(0.5, ge=0.0, le=1.0)  # probability
    gamma: tuple[float, float] = (0.8, 1.25)  # gamma range
    gamma_prob: float = Field(0.3, ge=0.0, le=1.0)  # probability
    blur_prob: float = Field(0.1, ge=0.0, le=1.0)  # probability of a Gaussian blur
    blur_max_kernel: int = Field(5, ge=3, le=31)  # largest blur kernel, pixels
    noise_prob: float = Field(0.2, ge=0.0, le=1.0)  # probability of Gaussian noise
    noise_std: tuple[float, float] = (2.0, 8.0)  # gray levels
    # simulated specular highlight on the tested image only
    glare_prob: float = Field(0.15, ge=0.0, le=1.0)
    glare_intensity: tuple[float, float] = (60.0, 180.0)  # peak gray levels added
    glare_radius: tuple[float, float] = (0.05, 0.25)  # ellipse semi-axis, fraction of the shorter side
    # boxes cut by the border keep their visible part if at least this fraction of them remains
    min_visibility: float = Field(0.4, ge=0.0, le=1.0)
    # whole-image training: the probability that an item is a window onto four images tiled 2 x 2
    mosaic_prob: float = Field(0.0, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _check_ranges(self) -> AugmentConfig:
        for name in ("scale", "gamma", "noise_std", "glare_intensity", "glare_radius"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"{name}: expected 0 <= low <= high, got ({low}, {high})")
        if self.scale[0] <= 0 or self.gamma[0] <= 0:
            raise ValueError("scale and gamma must be positive")
        return self
