"""`defectdet --help` starts without the heavy libraries: the command line builds its options from the settings
models, and those import neither PyTorch nor OpenCV nor NumPy. Each command loads what it needs when it runs.

A new import that brings one of them in at start (a default value read from a module that imports NumPy, say)
fails here; move the value to a module that imports nothing (as `defectdet.defaults`, `data.image_types`) or
import inside the command's body."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "cv2", "numpy")


def _loaded_after(statement: str) -> list[str]:
    """The heavy libraries in `sys.modules` after running `statement` in a fresh interpreter."""
    loaded = f"' '.join(name for name in {HEAVY!r} if name in sys.modules)"
    script = f"import sys\n{statement}\nprint('loaded:', {loaded})\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.rpartition("loaded:")[2].split()


def test_importing_the_command_line_loads_no_heavy_library() -> None:
    assert _loaded_after("import defectdet.cli") == []


def test_the_help_loads_no_heavy_library() -> None:
    statement = (
        "from defectdet.cli import main\n"
        "sys.argv = ['defectdet', '--help']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as done:\n"
        "    assert not done.code, done.code"
    )
    assert _loaded_after(statement) == []


def test_the_check_sees_a_heavy_import() -> None:
    assert _loaded_after("import defectdet.cli, numpy") == ["numpy"]
