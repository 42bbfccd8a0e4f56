"""report.html comes from the package's string.Template: it ships as package data and write_report fills
every placeholder (escaped) whatever the metrics hold."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from defectdet.evaluation.report import write_report

ROOT = Path(__file__).resolve().parents[2]


def test_the_template_is_package_data() -> None:
    line = re.search(r'^"defectdet\.evaluation" = \[(.*)\]$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert line is not None, "pyproject.toml [tool.setuptools.package-data] lacks defectdet.evaluation"
    patterns = re.findall(r'"([^"]+)"', line.group(1))
    template = "templates/report.html"
    assert (ROOT / "src/defectdet/evaluation" / template).is_file()
    assert any(fnmatch.fnmatch(template, pattern) for pattern in patterns)


def test_empty_metrics_fill_every_placeholder_and_escape_the_title(tmp_path: Path) -> None:
    path = write_report(tmp_path, {}, {}, "run <7> & co", {})
    text = path.read_text(encoding="utf-8")
    assert "$" not in text  # no placeholder left unfilled
    assert (
        text.count("<title>run &lt;7&gt; &amp; co</title>") == 1 and "<h1>run &lt;7&gt; &amp; co</h1>" in text
    )
    assert '<p class="muted">no plots</p>' in text and '<p class="muted">none recorded</p>' in text
    assert "recall ≥ 0" in text and "not reachable" in text  # no target-recall point: the 'bad' card
    assert text.endswith("</html>\n")


def test_settings_and_cards_are_escaped(tmp_path: Path) -> None:
    metrics = {"coco": {"mAP50": 0.5, "mAP50_95": 0.25}, "per_class": [{"class": "<b>", "gt": 3}]}
    text = write_report(tmp_path, metrics, {}, "t", {"data": "a<b>"}).read_text(encoding="utf-8")
    assert "<td style='text-align:left'>a&lt;b&gt;</td>" in text
    assert "<th>class</th><th>gt boxes</th>" in text and "<td>&lt;b&gt;</td><td>3</td>" in text
    assert "mAP@0.5 (COCO)" in text and "0.500" in text and "COCO AP by object size" in text
