"""Defaults that the settings models share with the NumPy and OpenCV code that applies them, in a module that
imports nothing: the settings (and the command line, which builds its options from them at start) read them without
loading that code. `defectdet.postprocess` and `evaluation.threshold` re-export theirs."""

from __future__ import annotations

# Post-processing (TrainConfig, training-time evaluation, `val`, the bundle): evaluation keeps every candidate above
# 0.001 so PR curves and operating points see low scores too.
DEFAULT_SCORE_FLOOR = 0.001
DEFAULT_NMS_IOU = 0.6
DEFAULT_MAX_DETECTIONS = 300
# The operating threshold (`ValidateSettings.target_escape`): at most 1 % of defective boards called clean on the
# calibration boards.
DEFAULT_TARGET_ESCAPE = 0.01
