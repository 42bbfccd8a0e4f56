"""What the service needs of a model: `ServablePredictor`, the part of `runtime.Predictor` it calls.

Typed as a protocol, not as `Predictor`, so that a stand-in (a test double, a model served from memory) that
has the same metadata and `predict` can be served too. No torch import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from defectdet.runtime.bundle import BundleMetadata
from defectdet.runtime.predictor import PredictionResult


class ServablePredictor(Protocol):
    """A loaded bundle the service can answer with: its metadata and one prediction per image."""

    metadata: BundleMetadata

    def predict(
        self,
        image: np.ndarray,
        template: np.ndarray | None = None,
        threshold: float | None = None,
        score_floor: float | None = None,
        *,
        companions: Mapping[str, np.ndarray] | None = None,
    ) -> PredictionResult: ...
