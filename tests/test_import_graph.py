"""The packages under src/defectdet form a DAG that follows one layer table (issue 21).

Every import counts: module-level, function-local (lazy) and `TYPE_CHECKING` ones, in the forms
`import defectdet.x`, `from defectdet.x import y`, `from defectdet import x` and relative imports. Each is mapped
to its package, the first component under `defectdet` (`defectdet.engine.trainer` -> `engine`, the top-level
module `defectdet/cli.py` -> `cli`, the package root `defectdet/__init__.py` -> `defectdet`). A package may
import only packages of a strictly lower layer. docs/design/architecture.md draws the same table.

Not counted: the string paths that `_lazy.lazy_exports` resolves on first attribute access (the package root
and `diagnostics` re-export names that way); they run no import until a caller asks for the name. Nor the package
root's `TYPE_CHECKING` block, which names the same exports for type checkers and the API reference and never
runs: a test holds it to exactly the lazy exports, so it cannot hide another dependency.
"""

from __future__ import annotations

import ast
import pickletools
import subprocess
import sys
import textwrap
import zipfile
from collections import defaultdict
from pathlib import Path

import pytest
from torch_blocker import BLOCK_TORCH

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "defectdet"

# package -> layer; an import must go to a strictly lower layer. The same table is in docs/design/architecture.md.
LAYERS: dict[str, int] = {
    # leaf modules: import nothing from defectdet
    "_lazy": 0,
    "_limits": 0,
    "cli_app": 0,  # the typer app classes (help shows flags without a value type); imports only typer
    "cli_option": 0,  # how a settings field shows on the command line (read by cli_settings)
    "defaults": 0,  # defaults the settings share with the NumPy/OpenCV code applying them (postprocess, threshold)
    "errors": 0,
    # the package root: __version__ and the lazy top-level exports
    "defectdet": 1,
    "compat": 1,  # the retired names (threshold, score floor, NMS IoU, input size) read as the current ones
    "postprocess": 1,  # NumPy + OpenCV NMS, shared by data, runtime, ...; its defaults are in `defaults`
    "data": 2,
    # model (torch), runtime (torch-free: reads and runs bundles) and trainingdata (torch: the training dataset,
    # augmentation, mosaic) sit side by side, none imports another; data is the torch-free part they share
    "model": 3,
    "runtime": 3,
    "trainingdata": 3,
    "evaluation": 4,
    # engine wraps a runtime Predictor as a model (engine.bundle_model) so that `val model.onnx` works
    "engine": 5,
    "diagnostics": 6,
    "export": 6,
    "cli_settings": 6,  # command options generated from the settings models (the doctor's and the CLI's)
    # the service (server, review, models store, metrics, static pages) on the runtime; only the CLI imports it
    "anomaly": 7,  # good-parts-only models: ImageNet features (model) written as a bundle (export)
    "demo": 7,
    "doctor_cli": 7,
    "serve": 7,
    "cli": 8,
}


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str, src: Path) -> bool:
    base = src.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imported_modules(path: Path, src: Path) -> list[tuple[str, int]]:
    """(absolute module name, line) of every defectdet import in the file, wherever it sits in the file."""
    module = _module_name(path, src)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = {id(node) for node in _root_type_checking_imports(tree)} if module == PACKAGE else set()
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.append((child if _is_module(child, src) else base, node.lineno))
    return [(name, line) for name, line in found if name == PACKAGE or name.startswith(PACKAGE + ".")]


def _root_type_checking_imports(tree: ast.Module) -> list[ast.ImportFrom]:
    """The `from ... import ...` statements of the module's top-level `if TYPE_CHECKING:` blocks."""
    return [
        node
        for block in tree.body
        if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
    ]


def test_the_roots_type_checking_names_are_exactly_its_lazy_exports() -> None:
    import defectdet

    root = SRC / PACKAGE / "__init__.py"
    named = {
        alias.asname or alias.name: node.module
        for node in _root_type_checking_imports(ast.parse(root.read_text()))
        for alias in node.names
    }
    assert named == defectdet._EXPORTS


def package_edges(src: Path) -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> where ('path:line'), over every module under src/defectdet."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted((src / PACKAGE).rglob("*.py")):
        source = _package_of(_module_name(path, src))
        for target, line in imported_modules(path, src):
            target_package = _package_of(target)
            if target_package != source:
                edges[(source, target_package)].append(f"{path.relative_to(src)}:{line}")
    return dict(edges)


def packages(src: Path) -> set[str]:
    return {_package_of(_module_name(path, src)) for path in (src / PACKAGE).rglob("*.py")}


def layer_violations(edges: dict[tuple[str, str], list[str]], layers: dict[str, int]) -> list[str]:
    """Every import that does not go to a strictly lower layer (or involves an undeclared package)."""
    problems = []
    for (source, target), where in sorted(edges.items()):
        if source not in layers or target not in layers:
            problems.append(f"{source} -> {target}: undeclared package ({', '.join(where)})")
        elif layers[target] >= layers[source]:
            problems.append(
                f"{source} (layer {layers[source]}) -> {target} (layer {layers[target]}): {', '.join(where)}"
            )
    return problems


def find_cycle(edges: dict[tuple[str, str], list[str]]) -> list[str] | None:
    """One cycle of the package graph as [a, b, ..., a], or None."""
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in edges:
        graph[source].add(target)
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def layer_table_markdown(layers: dict[str, int]) -> list[str]:
    """The rows of the table docs/design/architecture.md draws."""
    by_layer: dict[int, list[str]] = defaultdict(list)
    for name, layer in layers.items():
        by_layer[layer].append(name)
    return [
        f"| {layer} | {', '.join(f'`{name}`' for name in sorted(names))} |"
        for layer, names in sorted(by_layer.items())
    ]


def test_every_package_is_in_the_layer_table() -> None:
    assert packages(SRC) == set(LAYERS)


def test_imports_go_only_down_the_layers() -> None:
    assert layer_violations(package_edges(SRC), LAYERS) == []


def test_the_package_graph_has_no_cycles() -> None:
    assert find_cycle(package_edges(SRC)) is None


def test_the_checker_sees_the_known_edges() -> None:
    """Lazy (function-local) imports count: demo imports export inside a function, engine imports the
    runtime lazily (engine.bundle_model), the root only at module level."""
    edges = package_edges(SRC)
    for edge in [("demo", "export"), ("engine", "runtime"), ("engine", "model"), ("runtime", "data")]:
        assert edge in edges, edge
    assert ("engine", "diagnostics") not in edges and ("data", "model") not in edges
    assert ("serve", "runtime") in edges
    assert {source for source, target in edges if target == "serve"} == {"cli"}  # the service's one user


def test_the_runtime_and_data_never_import_trainingdata() -> None:
    """`trainingdata` is the torch part of the data pipeline; the torch-free runtime and the `data` package it
    shares with training import none of it, not even lazily."""
    edges = package_edges(SRC)
    assert ("trainingdata", "data") in edges  # the dataset reads through data's readers
    assert ("runtime", "trainingdata") not in edges and ("data", "trainingdata") not in edges


def test_data_and_the_runtime_import_with_torch_unimportable() -> None:
    """Every module of `data` and of `runtime` imports on a line PC without PyTorch, and pulls in no module of
    `trainingdata`, torch or albumentations; the augmentation settings (`trainingdata.augment_config`) read a
    training configuration without them too."""
    script = BLOCK_TORCH + textwrap.dedent(
        """
        import importlib, pkgutil
        import defectdet.data, defectdet.runtime
        names = [
            info.name
            for package in (defectdet.data, defectdet.runtime)
            for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
        ]
        for name in names:
            importlib.import_module(name)
        loaded = sorted(name for name in sys.modules if name.startswith(("defectdet.trainingdata", "albumentations")))
        assert not loaded and "torch" not in sys.modules, loaded
        import defectdet.trainingdata.augment_config
        assert "torch" not in sys.modules and "albumentations" not in sys.modules
        print(len(names))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) >= 20  # data: formats, synth, imageio, ...; runtime: predictor, ...


def test_architecture_doc_draws_the_same_table() -> None:
    text = (ROOT / "docs" / "design" / "architecture.md").read_text()
    missing = [row for row in layer_table_markdown(LAYERS) if row not in text]
    assert not missing, f"docs/design/architecture.md lacks these layer rows: {missing}"


def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    "back_import",
    [
        "def f():\n    from defectdet.engine.trainer import train\n",  # function-local
        "import defectdet.engine.trainer\n",
        "from ..engine import trainer\n",  # relative, from data/reader.py
        "from defectdet import engine\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..engine.trainer import train\n",
    ],
)
def test_a_planted_back_import_is_reported(tmp_path: Path, back_import: str) -> None:
    src = _plant(
        tmp_path,
        {
            "__init__.py": "",
            "errors.py": "",
            "data/__init__.py": "",
            "data/reader.py": "import os\n\nfrom defectdet.errors import DefectDetError\n" + back_import,
            "engine/__init__.py": "",
            "engine/trainer.py": "from defectdet.data.reader import DefectDetError\n",
        },
    )
    layers = {"errors": 0, "defectdet": 1, "data": 2, "engine": 5}
    edges = package_edges(src)
    assert edges[("engine", "data")] == ["defectdet/engine/trainer.py:1"]
    problems = layer_violations(edges, layers)
    assert len(problems) == 1 and problems[0].startswith(
        "data (layer 2) -> engine (layer 5): defectdet/data/reader.py:"
    )
    assert find_cycle(edges) in (["data", "engine", "data"], ["engine", "data", "engine"])


def test_an_undeclared_package_is_reported(tmp_path: Path) -> None:
    src = _plant(
        tmp_path, {"__init__.py": "", "errors.py": "", "extra/__init__.py": "from defectdet import errors\n"}
    )
    problems = layer_violations(package_edges(src), {"errors": 0, "defectdet": 1})
    assert problems == ["extra -> errors: undeclared package (defectdet/extra/__init__.py:1)"]


def test_files_written_before_the_move_pickle_no_defectdet_class() -> None:
    """Checkpoints and weight files hold tensors and plain values only (weights_only loading), so no class is
    pickled by its module path and moving modules cannot break loading old files; the shipped weights, written
    before the packages moved, are the witness."""
    weights = SRC / PACKAGE / "model" / "weights" / "nano_plain.pt"
    with zipfile.ZipFile(weights) as archive:
        pickled = archive.read(next(name for name in archive.namelist() if name.endswith("data.pkl")))
    strings = [arg for _, arg, _ in pickletools.genops(pickled) if isinstance(arg, str)]
    assert not [text for text in strings if text == PACKAGE or text.startswith(PACKAGE + ".")]
    from defectdet.model.pretrained import read_weights

    assert read_weights(weights)
