"""A bundle whose metadata does not describe its graph (class count, input size, channels) is refused on load
with an error naming the metadata field, not a raw onnxruntime or IndexError later."""

from __future__ import annotations

from pathlib import Path

import pytest

from defectdet.errors import CheckpointError
from defectdet.runtime.bundle import read_metadata, write_metadata
from defectdet.runtime.predictor import Predictor


def _with_metadata(bundle: Path, target: Path, **changes: object) -> Path:
    target.write_bytes(bundle.read_bytes())
    write_metadata(target, read_metadata(bundle).model_copy(update=changes))
    return target


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda meta: {"class_names": meta.class_names[:-1]}, "class_names"),
        (lambda meta: {"class_names": [*meta.class_names, "extra"]}, "class_names"),
        (lambda meta: {"input_size": meta.input_size - 32}, "input_size"),
        (lambda meta: {"channels": 3}, "channels"),
        (lambda meta: {"template": not meta.template}, "template"),
    ],
    ids=["fewer-classes", "more-classes", "input-size", "channels", "template"],
)
def test_metadata_that_does_not_match_the_graph_is_refused_naming_the_field(
    bundle_path: Path, tmp_path: Path, change, field: str
) -> None:
    broken = _with_metadata(bundle_path, tmp_path / "broken.onnx", **change(read_metadata(bundle_path)))
    with pytest.raises(CheckpointError, match=rf"broken\.onnx: bundle metadata field '{field}'"):
        Predictor(broken)


def test_matching_metadata_loads(bundle_path: Path) -> None:
    assert Predictor(bundle_path).metadata == read_metadata(bundle_path)
