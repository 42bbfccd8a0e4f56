"""Good-parts-only models: fitted on defect-free images alone, written as a standard bundle.

`fit_good_only` (`defectdet fit`) builds a memory bank of ImageNet patch features of good images (greedy
coreset), chooses the threshold on held-out good images at a target false-call rate, and writes a bundle whose
graph scores every stride-8 cell by its distance to the nearest good patch, as boxes of one class, "anomaly".
Modules: inputs (the good images), graph (features and the bundle graph), memory (coreset and calibration), fit
(the steps), bundle (the file and its metadata).
"""

from __future__ import annotations

from defectdet.anomaly.fit import FitResult, FitSettings, fit_good_only

__all__ = ["FitResult", "FitSettings", "fit_good_only"]
