"""`RecaptureConfig`, the nuisances of a clean recapture (`data.recapture`), apart from the NumPy and OpenCV code that
draws them: `ValidateSettings`, and the command line built from it, read it without loading either."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator


class RecaptureConfig(BaseModel):
    """Nuisances of a second capture of a good board. `RecaptureConfig.none()` is an exact copy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shift_px: tuple[float, float] = (0.25, 2.0)  # translation length range, pixels; direction uniform
    rotation_deg: tuple[float, float] = (0.0, 0.25)  # |angle| range, degrees; sign random
    gain: tuple[float, float] = (0.9, 1.1)  # exposure: multiplies intensities
    offset: tuple[float, float] = (-8.0, 8.0)  # black level, gray levels added
    gamma: tuple[float, float] = (0.8, 1.25)
    noise_std: tuple[float, float] = (1.0, 4.0)  # Gaussian sensor noise, gray levels
    jpeg_quality: tuple[int, int] | None = (75, 95)  # None: no re-encode

    @model_validator(mode="after")
    def _check(self) -> RecaptureConfig:
        for name in ("shift_px", "rotation_deg", "gain", "gamma", "noise_std", "offset", "jpeg_quality"):
            value = getattr(self, name)
            if value is None:
                continue
            low, high = value
            if low > high:
                raise ValueError(f"{name}: expected low <= high, got ({low}, {high})")
            if name not in ("offset",) and low < 0:
                raise ValueError(f"{name}: must not be negative, got ({low}, {high})")
        if self.gamma[0] <= 0 or self.gain[0] <= 0:
            raise ValueError("gamma and gain must be positive")
        if self.jpeg_quality is not None and not (1 <= self.jpeg_quality[0] and self.jpeg_quality[1] <= 100):
            raise ValueError(f"jpeg_quality must lie in 1..100, got {self.jpeg_quality}")
        return self

    @classmethod
    def none(cls) -> RecaptureConfig:
        """No nuisance: the clean board is the template itself (the old, optimistic test)."""
        return cls(
            shift_px=(0, 0),
            rotation_deg=(0, 0),
            gain=(1, 1),
            offset=(0, 0),
            gamma=(1, 1),
            noise_std=(0, 0),
            jpeg_quality=None,
        )

    def with_motion(self, shift_px: float, rotation_deg: float) -> RecaptureConfig:
        """The same photometric nuisances with a fixed shift length and |rotation|."""
        return self.model_copy(
            update={"shift_px": (shift_px, shift_px), "rotation_deg": (rotation_deg, rotation_deg)}
        )
