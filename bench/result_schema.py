"""The format of a result file in bench/results/: what every file carries, checked on write and on read.

A result file is one JSON object. Its envelope says what made it; every other top-level key is a measurement of
that benchmark (its own shape, read by the page that cites it):

- `schema_version`: SCHEMA_VERSION; a file of another version is refused rather than guessed at.
- `name`: the file's stem.
- `command`: the command that makes the file again, run from the repository root (`python -m bench.<name> ...`).
  `command_derived: true` marks a command rebuilt from the script and the settings for a file whose run did not
  record one.
- `environment`: `timestamp`, `git_commit`, `machine` and `versions` (see `bench.common.environment`), and
  `uncommitted_code` (null in files written before it was recorded).
- `settings`: what the run was asked for (an object, empty when the benchmark takes no options).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
ENVELOPE = ("schema_version", "name", "command", "environment", "settings")
ENVIRONMENT = {"timestamp": str, "git_commit": (str, type(None)), "machine": dict, "versions": dict}


class ResultFileError(ValueError):
    """A result file that does not follow the schema."""


def problems(document: Any, name: str | None = None) -> list[str]:
    """What keeps `document` from being a valid result file (named `name` when given); empty when valid."""
    if not isinstance(document, dict):
        return ["not a JSON object"]
    found = [f"no `{key}`" for key in ENVELOPE if key not in document]
    if document.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        found.append(f"schema_version {document['schema_version']!r}, this code reads {SCHEMA_VERSION}")
    if name is not None and document.get("name", name) != name:
        found.append(f"name {document['name']!r} is not the file's name {name!r}")
    if not isinstance(document.get("command", ""), str) or document.get("command") == "":
        found.append("`command` is not a non-empty string")
    if not isinstance(document.get("command_derived", False), bool):
        found.append("`command_derived` is not true or false")
    if not isinstance(document.get("settings", {}), dict):
        found.append("`settings` is not an object")
    environment = document.get("environment", {})
    if not isinstance(environment, dict):
        return [*found, "`environment` is not an object"]
    for key, kind in ENVIRONMENT.items():
        if "environment" in document and not isinstance(environment.get(key), kind):
            found.append(f"`environment.{key}` is missing or of the wrong type")
    if not isinstance(environment.get("uncommitted_code", []), list | type(None)):
        found.append("`environment.uncommitted_code` is not a list or null")
    return found


def check(document: dict[str, Any], name: str) -> None:
    """Raise ResultFileError listing what is wrong with `document`, a result file named `name`."""
    found = problems(document, name)
    if found:
        raise ResultFileError(f"result file {name}.json: " + "; ".join(found))


def read_result(path: Path) -> dict[str, Any]:
    """The result file at `path`, checked against the schema (ResultFileError when it does not follow it)."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ResultFileError(f"{path}: not JSON ({error})") from error
    check(document, path.stem)
    return document
