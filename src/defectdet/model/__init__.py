"""Template-aware anchor-free detector: presets, builder, info (post-processing is ``defectdet.postprocess``,
a torch-free leaf module that data.tiling and the runtime share).

Exports are resolved lazily (PEP 562) so that ``import defectdet.model`` does not pull in torch by itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from defectdet._lazy import lazy_exports

if TYPE_CHECKING:
    from defectdet.model.detector import PRESETS, Detector, build_model, detector_from_config
    from defectdet.model.info import model_info, preset_summaries

_EXPORTS = {
    "PRESETS": "defectdet.model.detector",
    "Detector": "defectdet.model.detector",
    "build_model": "defectdet.model.detector",
    "detector_from_config": "defectdet.model.detector",
    "model_info": "defectdet.model.info",
    "preset_summaries": "defectdet.model.info",
}

__all__ = ["PRESETS", "Detector", "build_model", "detector_from_config", "model_info", "preset_summaries"]

__getattr__ = lazy_exports(__name__, _EXPORTS)
