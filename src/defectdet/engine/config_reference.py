"""The configuration reference (docs/reference/configuration.md), generated from the typed config so it cannot drift.

Each field of `TrainConfig` (and `augment.*` of `AugmentConfig`) becomes a table row: name, type, default and
the comment written beside (or on the comment lines just above) its declaration in the source.

    python -m defectdet.engine.config_reference            # print the markdown
    python -m defectdet.engine.config_reference --write docs/reference/configuration.md   # replace the marked block
    python scripts/gen_reference.py   # writes the whole page (and the other generated reference pages)
"""

from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

START_MARKER = "<!-- config-reference:start -->"
END_MARKER = "<!-- config-reference:end -->"
_FIELD_LINE = re.compile(r"^    (\w+): [^=#]+(?:=.*?)?(?:#\s*(.*))?$")


def field_comments(model: type[BaseModel]) -> tuple[dict[str, str], dict[str, str]]:
    """(comment per field, section heading opening before a field). A trailing comment describes its field;
    a comment block right under another field line describes the next field; a comment block after a blank
    line is a section heading."""
    comments: dict[str, str] = {}
    sections: dict[str, str] = {}
    pending: list[str] = []
    pending_is_section = False
    previous_blank = True
    for line in inspect.getsource(model).splitlines():
        stripped = line.strip()
        is_comment = stripped.startswith("#") and line.startswith("    ") and not line.startswith("        ")
        if is_comment:
            if not pending:
                pending_is_section = previous_blank
            pending.append(stripped.lstrip("#").strip())
        match = None if is_comment else _FIELD_LINE.match(line)
        if match and match.group(1) in model.model_fields:
            name, trailing = match.group(1), (match.group(2) or "").strip()
            if pending and pending_is_section:
                sections[name] = " ".join(pending)
                comments[name] = trailing
            else:
                comments[name] = trailing or " ".join(pending)
        if not is_comment:
            pending = []
        previous_blank = not stripped
    return comments, sections


def _type_name(annotation: Any) -> str:
    text = str(annotation).replace("typing.", "").replace("pathlib.", "").replace("NoneType", "None")
    text = re.sub(r"<class '([\w.]+)'>", lambda m: m.group(1).rsplit(".", 1)[-1], text)
    return text.replace("defectdet.trainingdata.augment.", "")


def _default(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    if field.default_factory is not None:
        return (
            "(section)" if isinstance(field.default_factory(), BaseModel) else repr(field.default_factory())
        )
    return repr(field.default)


def _rows(model: type[BaseModel], prefix: str = "") -> list[str]:
    comments, sections = field_comments(model)
    rows = []
    for name, field in model.model_fields.items():
        default = _default(model, name)
        if default == "(section)":
            continue
        if name in sections:
            rows.append(f"| **{sections[name]}** | | | |")
        note = comments.get(name, "").replace("|", "\\|")
        kind = _type_name(field.annotation).replace("|", "\\|")
        rows.append(f"| `{prefix}{name}` | `{kind}` | `{default}` | {note} |")
    return rows


def config_reference() -> str:
    """The markdown table of every training option (YAML key, `--set key=value`)."""
    from defectdet.engine.config import TrainConfig
    from defectdet.trainingdata.augment_config import AugmentConfig

    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    lines += _rows(TrainConfig)
    lines += _rows(AugmentConfig, "augment.")
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """``text`` with the part between the markers replaced by ``block``."""
    start, end = text.index(START_MARKER) + len(START_MARKER), text.index(END_MARKER)
    return text[:start] + "\n" + block + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print or write the configuration reference.")
    parser.add_argument("--write", type=Path, help="Markdown file whose marked block is replaced.")
    args = parser.parse_args(argv)
    block = config_reference()
    if args.write is None:
        print(block)
        return 0
    args.write.write_text(replace_block(args.write.read_text(encoding="utf-8"), block), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
