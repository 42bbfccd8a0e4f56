"""One name per concept on every public surface: threshold, score floor, NMS IoU, input size.

The names these replaced (`conf`, `conf_threshold`, `thresholds.score`; `score_threshold`, `min_score`;
`nms_iou_threshold`, `iou_threshold`; `imgsz`) may appear nowhere a user reads or types them: the CLI's help of
every command, the HTTP API's parameter and field names, the signatures and fields of the public Python API,
docs/ and README.md. They are still accepted where old scripts, configs and bundles use them (tested here
too), hidden from help. A paragraph of the docs that says "deprecated" or "older versions" may name them. Not checked: the design
notes (docs/design: internal code, quoted verbatim) and the benchmark manifest (the exact commands results were
made with).
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
RETIRED = {
    "conf",
    "conf_threshold",
    "score_threshold",
    "min_score",
    "nms_iou_threshold",
    "iou_threshold",
    "imgsz",
}
RETIRED_OPTIONS = {"--conf", "--conf-from", "--conf-rule", "--conf-threshold", "--imgsz", "--min-score",
                   "--score-threshold", "--iou-threshold", "--nms-iou-threshold"}  # fmt: skip
_IN_TEXT = re.compile(
    r"(?<![\w.-])(--conf(?:-from|-rule|-threshold)?|--imgsz|--min-score|--score-threshold|--(?:nms-)?iou-threshold"
    r"|imgsz|conf_threshold|score_threshold|min_score|nms_iou_threshold|iou_threshold|thresholds\.score)"
    r"(?![\w-])|(?<![\w.-])conf=|`conf`"
)
_EXEMPT = re.compile(r"deprecated|older versions", re.I)

_spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
gen = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("gen_reference", gen)
_spec.loader.exec_module(gen)


def retired_in_text(text: str) -> list[str]:
    """Retired names used in `text`, paragraph by paragraph; paragraphs about deprecation are exempt."""
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        if not _EXEMPT.search(paragraph):
            found += [match.group(0) for match in _IN_TEXT.finditer(paragraph)]
    return found


def test_the_text_check_finds_retired_names_and_spares_current_ones() -> None:
    assert retired_in_text("use `--conf 0.3` or conf=0.3; `imgsz`: 640; thresholds.score") == [
        "--conf", "conf=", "imgsz", "thresholds.score"
    ]  # fmt: skip
    assert (
        retired_in_text(
            "--threshold, --threshold-from, score_floor, nms_iou, input_size, confusion, --config"
        )
        == []
    )
    assert retired_in_text("Older versions said `imgsz`.\n\nNow `input_size`.") == []


def test_cli_help_uses_the_current_names() -> None:
    bad = []
    for name, command in gen.walk(gen.cli_command()):
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            bad += [f"{name} {opt}" for opt in (*param.opts, *param.secondary_opts) if opt in RETIRED_OPTIONS]
            bad += [f"{name} {param.name}: {word}" for word in retired_in_text(gen.param_help(param))]
        bad += [f"{name}: {word}" for word in retired_in_text(command.help or "")]
    assert not bad, bad


def test_retired_option_names_still_work_with_a_note(tmp_path: Path) -> None:
    from defectdet.cli import app, current_option_names

    assert current_option_names(["val", "--conf", "0.3", "--conf-from=train", "--", "--conf"]) == [
        "val", "--threshold", "0.3", "--threshold-from=train", "--", "--conf"
    ]  # fmt: skip
    result = CliRunner().invoke(
        app, ["predict", str(tmp_path / "model.onnx"), str(tmp_path), "--conf", "0.5"]
    )
    assert "--conf is deprecated: use --threshold" in result.output
    assert "bundle file not found" in str(result.exception)  # parsed: it failed on the missing bundle instead


def test_http_parameters_use_the_current_names() -> None:
    document = gen.openapi_schema()
    names = set()
    for methods in document["paths"].values():
        for operation in methods.values():
            names |= {param["name"] for param in operation.get("parameters", [])}
            for content in operation.get("requestBody", {}).get("content", {}).values():
                names |= set(gen._resolve(content.get("schema", {}), document).get("properties", {}))
    for schema in document.get("components", {}).get("schemas", {}).values():
        names |= set(schema.get("properties", {}))
    assert "threshold" in names and not names & RETIRED, names & RETIRED


RESULT_TYPES = {"TrainResult", "PredictionResult", "Detection"}  # what the API returns: fields, not settings


def _public_names() -> dict[str, list[str]]:
    import defectdet
    from defectdet.engine.validate import ValidateSettings
    from defectdet.runtime.bundle import BundleMetadata, Thresholds

    surfaces: dict[str, list[str]] = {}
    for name in defectdet._EXPORTS:
        if name in RESULT_TYPES:
            continue
        value = getattr(defectdet, name)
        if inspect.isclass(value) and hasattr(value, "model_fields"):
            surfaces[name] = list(value.model_fields)
        elif callable(value):
            surfaces[name] = list(inspect.signature(value).parameters)
    surfaces["Predictor.predict"] = list(inspect.signature(defectdet.Predictor.predict).parameters)
    for model in (ValidateSettings, BundleMetadata, Thresholds):
        surfaces[model.__name__] = list(model.model_fields)
    return surfaces


def test_public_python_names_use_the_current_names() -> None:
    surfaces = _public_names()
    assert {"train", "validate", "export_bundle", "predict", "compare", "Predictor", "serve_bundle"} <= set(
        surfaces
    )
    bad = {
        name: sorted(set(params) & (RETIRED | {"score", "score_source"})) for name, params in surfaces.items()
    }
    assert not any(bad.values()), {name: params for name, params in bad.items() if params}


def test_retired_python_names_still_work_with_a_warning() -> None:
    from defectdet.engine.config import TrainConfig
    from defectdet.runtime.bundle import BundleMetadata

    with pytest.warns(DeprecationWarning, match="'imgsz' is deprecated: use 'input_size'"):
        assert TrainConfig(imgsz=320).input_size == 320
    with pytest.warns(DeprecationWarning, match="'score_threshold' is deprecated: use 'score_floor'"):
        assert TrainConfig(score_threshold=0.01).score_floor == 0.01
    old = {"defectdet_version": "0.0.9", "created": "", "class_names": ["a"], "input_size": 64, "channels": 1,
           "template": False, "thresholds": {"score": 0.4, "score_source": "best F1", "min_score": 0.01},
           "train_config": {"imgsz": 64, "score_threshold": 0.01}}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an old bundle loads without noise
        meta = BundleMetadata.model_validate(old)
    assert (meta.thresholds.threshold, meta.thresholds.score_floor) == (0.4, 0.01)
    with pytest.warns(DeprecationWarning):
        assert meta.thresholds.score == 0.4


# Inside the code too: a retired name is read in one place, the table of defectdet.compat, and nowhere else
# (as an identifier, or in a string or comment: a message, a report, a flag). metrics.json keeps its
# "iou_threshold" key, the match IoU of an evaluation (not the NMS IoU): a file users read.
RETIRED_IDENTIFIERS = RETIRED | {
    "conf_from",
    "conf_rule",
    "CONF_RULES",
    "DEFAULT_SCORE_THRESHOLD",
    "DEFAULT_IMGSZ",
}
_RETIRED_IN_CODE_TEXT = re.compile(
    r"(?<![\w-])(--conf(?:-from|-rule|-threshold)?|--imgsz|--min-score|--score-threshold|--(?:nms-)?iou-threshold"
    r"|imgsz|IMGSZ|conf|CONF|conf_threshold|conf_from|conf_rule|min_score|score_threshold|nms_iou_threshold)"
    r"(?![\w-])"
)
SOURCE = ROOT / "src" / "defectdet"
COMPAT = SOURCE / "compat.py"


def retired_in_code(text: str) -> list[str]:
    """Retired names in Python source `text`: identifiers, and words of its strings and comments."""
    import io
    import tokenize

    found = []
    texts = {tokenize.STRING, tokenize.COMMENT, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.NAME and token.string in RETIRED_IDENTIFIERS:
            found.append(f"{token.start[0]}: {token.string}")
        elif token.type in texts:
            found += [
                f"{token.start[0]}: {match.group(0)}"
                for match in _RETIRED_IN_CODE_TEXT.finditer(token.string)
            ]
    return found


def test_the_code_check_finds_retired_names_and_spares_current_ones() -> None:
    code = 'def f(conf, imgsz=640):  # min_score\n    return g(score_floor=conf, flag="--conf-from")\n'
    assert retired_in_code(code) == ["1: conf", "1: imgsz", "1: min_score", "2: conf", "2: --conf-from"]
    assert retired_in_code('x = "confusion config conference"; input_size = threshold_from = 1\n') == []


def test_retired_names_appear_only_in_the_compatibility_table() -> None:
    found = {}
    for path in sorted(SOURCE.rglob("*.py")):
        if path != COMPAT:
            found[str(path.relative_to(ROOT))] = retired_in_code(path.read_text("utf-8"))
    for path in sorted(SOURCE.rglob("*.html")):  # templates: the report users open
        found[str(path.relative_to(ROOT))] = [
            m.group(0) for m in _RETIRED_IN_CODE_TEXT.finditer(path.read_text("utf-8"))
        ]
    assert not any(found.values()), {path: names for path, names in found.items() if names}
    assert retired_in_code(COMPAT.read_text("utf-8"))  # the table itself names them


USER_PAGES = [
    path
    for path in sorted((ROOT / "docs").rglob("*.md"))
    if path.parent.name != "design" and path.name != "manifest.md"
]


@pytest.mark.parametrize("path", [*USER_PAGES, ROOT / "README.md"],
                         ids=lambda path: str(path.relative_to(ROOT)))  # fmt: skip
def test_docs_use_the_current_names(path: Path) -> None:
    assert retired_in_text(path.read_text("utf-8")) == [], f"{path.relative_to(ROOT)} uses retired names"
