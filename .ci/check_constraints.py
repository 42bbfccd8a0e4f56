"""Fails when the installed packages differ from constraints.txt (a missing pin, a drifted version).

Run by .ci/run after `make install`, so a dependency added to pyproject.toml without `make lock` shows up
as an unpinned package instead of floating to whatever PyPI serves that day.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def parse(lines: list[str]) -> dict[str, str]:
    pins = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version.split("+", 1)[0]
    return pins


def main() -> int:
    root = Path(__file__).resolve().parents[1]
    wanted = parse((root / "constraints.txt").read_text().splitlines())
    python = sys.argv[1] if len(sys.argv) > 1 else sys.executable
    frozen = subprocess.run(
        [python, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    installed = parse(frozen)
    problems = [
        f"{name}=={version} is installed but not pinned"
        for name, version in installed.items()
        if name not in wanted
    ]
    problems += [
        f"{name}: constraints.txt pins {wanted[name]}, installed {version}"
        for name, version in installed.items()
        if name in wanted and wanted[name] != version
    ]
    for problem in problems:
        print(f"constraints.txt: {problem} (run `make lock` after changing dependencies)", file=sys.stderr)
    if not problems:
        print(f"constraints.txt: all {len(installed)} installed packages match their pins")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
