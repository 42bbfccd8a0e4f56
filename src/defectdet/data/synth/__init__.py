"""Procedural PCB boards with exact defect boxes (`defectdet synth`).

`synthesize_dataset` writes a YOLO-style dataset with templates; `generate_board` makes one
board in memory. Modules: layout (defect-free board), defects (damage + exact boxes),
render (camera look), board (one pair), writer (files).
"""

from __future__ import annotations

from defectdet.data.synth.board import SynthBoard, generate_board
from defectdet.data.synth.defects import CLASS_NAMES
from defectdet.data.synth.writer import synthesize_dataset

__all__ = ["CLASS_NAMES", "SynthBoard", "generate_board", "synthesize_dataset"]
