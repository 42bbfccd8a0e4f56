"""Synthetic datasets with exact defect boxes (`defectdet synth`).

`synthesize_dataset` writes a YOLO-style dataset (what it writes: `SynthSettings`): PCB boards with
templates (`kind='pcb'`) or textured surfaces without (`kind='surface'`). `generate_board` /
`generate_surface` make one image in memory. Modules: layout (defect-free board), defects (damage + exact
boxes), render (camera look), board (one pair), surface (materials and surface defects), companion (a second
lighting of an image: `synth --companion`), shift (a shifted line: `synth --shift`), settings
(`SynthSettings`), writer (files).
"""

from __future__ import annotations

from defectdet.data.synth.board import SynthBoard, generate_board
from defectdet.data.synth.defects import CLASS_NAMES
from defectdet.data.synth.settings import SYNTH_OPTIONS, SynthSettings
from defectdet.data.synth.surface import SURFACE_CLASS_NAMES, SynthSurface, generate_surface
from defectdet.data.synth.writer import KINDS, synthesize_dataset

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
