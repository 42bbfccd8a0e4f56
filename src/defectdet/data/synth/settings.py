"""`SynthSettings`, what `synthesize_dataset` writes, and `defectdet synth`'s options (`SYNTH_OPTIONS`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from defectdet.cli_option import CliOption


def _names(text: str) -> tuple[str, ...]:
    """A comma list as typed (`--materials tile,weave`) -> its names."""
    return tuple(name.strip() for name in text.split(","))


class SynthSettings(BaseModel):
    """What `synthesize_dataset` writes: how many images of which kind, their sizes and colour, and what goes
    with them (templates, companion captures, a shifted line). None: the kind's own default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    boards: int = 40  # boards or surfaces (images) to write
    seed: int = 0  # the same seed writes the same files
    kind: str = "pcb"  # one of KINDS: pcb (boards with templates) or surface (textured surfaces, no template)
    template: bool | None = None  # write each board's defect-free template (pcb; None: on)
    min_size: int | None = None  # smallest image side in pixels (None: pcb 480, surface 128)
    max_size: int | None = None  # largest image side in pixels (None: pcb 800, surface 2048)
    color: bool | None = None  # all RGB or all gray (None: pcb gray, surface half and half)
    materials: tuple[str, ...] | None = None  # surface textures (None: all of synth.surface.MATERIALS)
    shift: tuple[str, ...] = ()  # a shifted line: the tested images through a new lamp, lens or camera
    companions: tuple[str, ...] = ()  # an aligned capture of each image under another lighting, per name
    val_fraction: float = 0.2  # share of the images in the val split
    progress: bool = True  # show a progress bar


# `defectdet synth`'s options, in the order its help lists them
SYNTH_OPTIONS: dict[str, CliOption] = {
    "boards": CliOption(help="Number of boards / surfaces (images)."),
    "seed": CliOption(help="Random seed; the same seed writes the same dataset."),
    "kind": CliOption(
        help="pcb: PCB boards with templates; surface: textured surfaces (steel, tile, weave, cast), no template."
    ),
    "template": CliOption(
        flag="--template/--no-template", help="Also render the defect-free template (pcb; default on)."
    ),
    "min_size": CliOption(help="Smallest image side in pixels (pcb 480, surface 128)."),
    "max_size": CliOption(help="Largest image side in pixels (pcb 800, surface 2048)."),
    "color": CliOption(
        flag="--color/--gray", help="All RGB or all gray (default: pcb gray, surface half and half)."
    ),
    "materials": CliOption(
        help="Surface textures, comma-separated, from brushed,rolled,tile,weave,cast (default: all).",
        type=str,
        to_setting=_names,
    ),
    "shift": CliOption(
        help="A shifted line: the tested images seen through a new lamp, lens or camera, comma-separated from "
        "lamp,lens,camera (templates stay as captured before; boxes unchanged). Same --seed, other boards: "
        "pass another seed for the new line.",
        type=str,
        default=None,
        to_setting=lambda text: _names(text) if text else None,
    ),
    "companions": CliOption(
        flag="--companion",
        help="NAME: also write an aligned companion capture of every image under another lighting, in "
        "companions/NAME/ (repeatable, or a comma list); the defects are then faint in the images and plain "
        "in the companions, and data.yaml declares them.",
        type=list[str],
        default=None,
        to_setting=tuple,
    ),
}
