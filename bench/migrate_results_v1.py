"""One-off: bring the result files written before the schema (bench/result_schema.py) to its version 1.

    python -m bench.migrate_results_v1            # rewrites bench/results/*.json in place; a file at v1 is kept

Per file: `schema_version` 1; the envelope keys first; `settings` an object (empty when the run recorded none);
`command` in the `python -m bench.<name>` form, and where the run recorded none, the command rebuilt from the
script and the settings it recorded, marked `command_derived`. Measurements are not touched.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR
from bench.result_schema import ENVELOPE, SCHEMA_VERSION, problems

BENCH = Path(__file__).resolve().parent
SCRIPT_COMMAND = re.compile(r"\bpython3? bench/(\w+)\.py")


def as_module_command(command: str) -> str:
    """`python bench/x.py ARGS` -> `python -m bench.x ARGS`."""
    return SCRIPT_COMMAND.sub(lambda match: f"python -m bench.{match.group(1)}", command)


def script_for(name: str) -> Path | None:
    """The bench script a result file is named after: the longest script name its name starts with."""
    for stem in sorted((path.stem for path in BENCH.glob("*.py")), key=len, reverse=True):
        if name == stem or name.startswith(stem + "_"):
            return BENCH / f"{stem}.py"
    return None


def derived_command(name: str, document: dict[str, Any]) -> str:
    """A command for a file whose run recorded none: the script, then each recorded setting it has an option
    for (a `--summary` file when it holds no run of its own)."""
    script = script_for(name)
    if script is None:
        return "python -m bench.?"
    source = script.read_text(encoding="utf-8")
    settings = dict(document.get("settings") or {})
    settings.setdefault("preset", document.get("preset"))
    settings["minutes"] = settings.pop("time_minutes", None) or document.get("minutes")
    parts = [f"python -m bench.{script.stem}"]
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if value is None or isinstance(value, dict | list):
            continue
        if isinstance(value, bool):
            flag = flag if value else "--no-" + key.replace("_", "-")
            parts += [flag] if f'"{flag}"' in source else []
        elif f'"{flag}"' in source:
            parts.append(f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}")
    if "final" not in document and "settings" not in document and '"--summary"' in source:
        parts.append("--summary")
    return " ".join(parts)


def migrate(name: str, document: dict[str, Any]) -> dict[str, Any]:
    """The version-1 form of an older result file."""
    if document.get("schema_version") == SCHEMA_VERSION:
        return document
    command = document.get("command")
    derived = not command
    command = derived_command(name, document) if derived else as_module_command(str(command))
    envelope = {
        "schema_version": SCHEMA_VERSION,
        "name": document.get("name", name),
        "command": command,
        **({"command_derived": True} if derived else {}),
        "environment": document["environment"],
        "settings": document.get("settings") or {},
    }
    rest = {key: value for key, value in document.items() if key not in (*ENVELOPE, "command_derived")}
    if isinstance(rest.get("rescored_by"), str):
        rest["rescored_by"] = as_module_command(rest["rescored_by"])
    return {**envelope, **rest}


def main(folder: Path = RESULTS_DIR) -> int:
    failed = 0
    for path in sorted(folder.glob("*.json")):
        document = json.loads(path.read_text(encoding="utf-8"))
        migrated = migrate(path.stem, document)
        found = problems(migrated, path.stem)
        if found:
            print(f"{path.name}: {'; '.join(found)}", file=sys.stderr)
            failed += 1
        elif migrated != document or list(migrated) != list(document):
            path.write_text(json.dumps(migrated, indent=2) + "\n", encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
