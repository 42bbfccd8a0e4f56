"""`ReviewSettings`, how `defectdet review` serves (or exports) a folder of kept images, and its options
(`REVIEW_OPTIONS`). No torch import."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from defectdet.cli_option import CliOption
from defectdet.data.formats.label_settings import class_list


@dataclass(frozen=True)
class ReviewSettings:
    """Where the review page listens (`host`, `port`) and who may reach it: a token from `token_file` (else the
    DEFECTDET_TOKEN environment variable) and the Host names of `allowed_hosts` besides the loopback ones.
    `operator` is logged with each decision; `classes` (None: the kept sidecars' bundle classes, then those
    classes.txt adds, else classes.txt) name the class ids. `export_coco`: write the reviewed labels as COCO json
    to this file instead of serving. `model`: a good-parts-only bundle whose anomaly map the page draws."""

    host: str = "127.0.0.1"
    port: int = 8001
    token_file: Path | None = None
    operator: str = ""
    classes: list[str] | None = None
    allowed_hosts: tuple[str, ...] = ()
    export_coco: Path | None = None
    model: Path | None = None


# `defectdet review`'s options, in the order its help lists them
REVIEW_OPTIONS: dict[str, CliOption] = {
    "host": CliOption(help="Interface to listen on."),
    "port": CliOption(help="TCP port."),
    "token_file": CliOption(
        help="File holding an access token (or set DEFECTDET_TOKEN): the API then needs it."
    ),
    "operator": CliOption(help="Who decides (logged with each decision); or the page's name field."),
    "classes": CliOption(
        help="Class names, comma-separated (default: the kept sidecars' bundle classes, then those classes.txt "
        "adds; else classes.txt).",
        type=str,
        to_setting=class_list,
    ),
    "allowed_hosts": CliOption(
        flag="--allowed-host",
        help="A Host name clients use (repeatable).",
        type=list[str],
        default=[],
        to_setting=tuple,
    ),
    "export_coco": CliOption(
        help="Write the reviewed labels as COCO json to this file and exit (no server)."
    ),
    "model": CliOption(
        help="A good-parts-only bundle (defectdet fit): the page draws its anomaly map under the boxes."
    ),
}
