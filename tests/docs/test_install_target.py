"""`make install` takes PyTorch from the CPU-only index unless told otherwise."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _install_commands(*overrides: str) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # -n prints the commands without running them, -B as if nothing were installed yet
    out = subprocess.run(
        ["make", "-n", "-B", "-C", str(ROOT), "install", *overrides],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if "pip install" in line]


def test_torch_comes_from_the_cpu_index_before_anything_else() -> None:
    commands = _install_commands()
    torch_line = next(line for line in commands if "torch==" in line)
    assert f"--index-url {CPU_INDEX}" in torch_line
    # torch goes in before defectdet, whose requirements would otherwise pull the PyPI (CUDA) build
    assert commands.index(torch_line) < next(i for i, line in enumerate(commands) if "-e '.[dev]'" in line)


def test_another_torch_index_is_one_setting() -> None:
    torch_line = next(
        line for line in _install_commands("TORCH_INDEX=https://pypi.org/simple") if "torch==" in line
    )
    assert "--index-url https://pypi.org/simple" in torch_line and CPU_INDEX not in torch_line
