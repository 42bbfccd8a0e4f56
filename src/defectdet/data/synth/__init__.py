"""Synthetic datasets with exact defect boxes (`defectdet synth`).

`synthesize_dataset` writes a YOLO-style dataset (what it writes: `SynthSettings`): PCB boards with
templates (`kind='pcb'`) or textured surfaces without (`kind='surface'`). `generate_board` /
`generate_surface` make one image in memory. Modules: layout (defect-free board), defects (damage + exact
boxes), render (camera look), board (one pair), surface (materials and surface defects), companion (a second
lighting of an image: `synth --companion`), shift (a shifted line: `synth --shift`), settings
(`SynthSettings`), writer (files). The names below are imported on first use, so that the command line can
read `SynthSettings` without loading the generators.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from defectdet._lazy import lazy_exports

if TYPE_CHECKING:
    from defectdet.data.synth.board import SynthBoard as SynthBoard
    from defectdet.data.synth.board import generate_board as generate_board
    from defectdet.data.synth.defects import CLASS_NAMES as CLASS_NAMES
    from defectdet.data.synth.settings import SYNTH_OPTIONS as SYNTH_OPTIONS
    from defectdet.data.synth.settings import SynthSettings as SynthSettings
    from defectdet.data.synth.surface import SURFACE_CLASS_NAMES as SURFACE_CLASS_NAMES
    from defectdet.data.synth.surface import SynthSurface as SynthSurface
    from defectdet.data.synth.surface import generate_surface as generate_surface
    from defectdet.data.synth.writer import KINDS as KINDS
    from defectdet.data.synth.writer import synthesize_dataset as synthesize_dataset

__all__ = [
    "CLASS_NAMES",
    "KINDS",
    "SURFACE_CLASS_NAMES",
    "SYNTH_OPTIONS",
    "SynthBoard",
    "SynthSettings",
    "SynthSurface",
    "generate_board",
    "generate_surface",
    "synthesize_dataset",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "CLASS_NAMES": "defectdet.data.synth.defects",
        "KINDS": "defectdet.data.synth.writer",
        "SURFACE_CLASS_NAMES": "defectdet.data.synth.surface",
        "SYNTH_OPTIONS": "defectdet.data.synth.settings",
        "SynthBoard": "defectdet.data.synth.board",
        "SynthSettings": "defectdet.data.synth.settings",
        "SynthSurface": "defectdet.data.synth.surface",
        "generate_board": "defectdet.data.synth.board",
        "generate_surface": "defectdet.data.synth.surface",
        "synthesize_dataset": "defectdet.data.synth.writer",
    },
)
