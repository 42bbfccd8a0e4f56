"""Result files, figure formatting and the page builder shared by every benchmark page."""

from __future__ import annotations

import os
import re
import statistics
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.result_schema import ResultFileError, read_result

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
OUT = ROOT / "docs" / "benchmarks"
IMG = OUT / "img"
BENCH = ROOT / "bench"
PAGES = ("index", "accuracy", "peers", "inference", "service", "training-speed", "manifest")
NOT_CODE = (".pt", ".json", ".png", ".md", ".log")  # uncommitted files that are a run's output, not its code


@dataclass
class Result:
    name: str  # file stem
    doc: dict[str, Any]

    @property
    def file(self) -> str:
        return f"{self.name}.json"

    @property
    def env(self) -> dict[str, Any]:
        return self.doc.get("environment") or {}

    @property
    def command(self) -> str:
        return str(self.doc.get("command") or "")

    @property
    def cpu(self) -> str:
        model = str(self.env.get("machine", {}).get("cpu_model", "unknown CPU"))
        return model.replace("(R)", "").replace(" Processor", "").strip()

    @property
    def cores(self) -> int | None:
        return self.env.get("machine", {}).get("usable_cores")

    @property
    def machine(self) -> str:
        count = self.env.get("machine", {}).get("cpu_count")
        return f"{self.cpu}, {count} cores" if count else self.cpu

    @property
    def threads(self) -> str:
        threads = self.doc.get("threads", (self.doc.get("settings") or {}).get("threads"))
        if isinstance(threads, int):
            return str(threads)
        return str(self.cores) if self.cores else "-"

    @property
    def commit(self) -> str:
        return str(self.env.get("git_commit") or "not recorded")

    @property
    def date(self) -> str:
        return str(self.env.get("timestamp") or "")[:10] or "not recorded"

    @property
    def uncommitted(self) -> list[str] | None:
        """Uncommitted code files when the run started; None when the file predates that record."""
        found = self.env.get("uncommitted_code")
        return None if found is None else list(found)

    @property
    def dirty(self) -> bool:
        """Made from uncommitted code: said by the file (`dirty`), or an uncommitted code file it recorded."""
        return self.doc.get("dirty") is True or any(not p.endswith(NOT_CODE) for p in self.uncommitted or [])

    @property
    def final(self) -> dict[str, Any]:
        return self.doc.get("final") or {}

    @property
    def map50(self) -> float:
        return float(self.final["mAP50"])

    @property
    def steps(self) -> int | None:
        return self.final.get("steps")

    @property
    def preset(self) -> str:
        return str(self.doc.get("preset") or self.doc.get("settings", {}).get("preset") or "-")

    @property
    def minutes(self) -> float | None:
        minutes = self.doc.get("minutes") or self.doc.get("settings", {}).get("time_minutes")
        return float(minutes) if minutes else None

    def seed(self) -> int:
        """The run's seed: set as an override, else in its settings, else at the top of the file."""
        settings = self.doc.get("settings") or {}
        seed = settings.get("seed", self.doc.get("seed", 0))
        return int((self.doc.get("overrides") or {}).get("seed", seed) or 0)

    def class_ap(self, name: str) -> float | None:
        return (self.doc.get("held_out_per_class_AP50") or {}).get(name)


def load_results(folder: Path = RESULTS) -> dict[str, Result]:
    results = {}
    for path in sorted(folder.glob("*.json")):
        try:
            results[path.stem] = Result(path.stem, read_result(path))
        except ResultFileError as error:
            raise SystemExit(str(error)) from error
    return results


def script_of(result: Result) -> str | None:
    """The bench script a result file's command runs (`python -m bench.<name>`); None for another command."""
    words = result.command.split()
    module = words[words.index("-m") + 1] if "-m" in words[:-1] else ""
    return f"bench/{module.removeprefix('bench.')}.py" if module.startswith("bench.") else None


def command_of(result: Result) -> tuple[str, bool]:
    """(command, recorded): the command that makes the file again; recorded False when the file's run recorded
    none and it was rebuilt from the script and the settings."""
    return result.command, not result.doc.get("command_derived", False)


def threads_text(threads: str) -> str:
    return f"{threads} thread" + ("" if threads == "1" else "s")


def trained_on(source: Result | None) -> str:
    """Steps and machine of the training run a measurement used."""
    if source is None:
        return "-"
    return f"{count(source.steps)} steps, {source.cpu}, {threads_text(source.threads)}"


def f3(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def f1(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def f2(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def minutes_of(seconds: float | None) -> str:
    return "not reached" if seconds is None else f"{seconds / 60:.1f}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def spread(values: Sequence[float]) -> str:
    """mean (min-max, n runs) of accuracy figures."""
    if len(values) == 1:
        return f"{values[0]:.3f} (one run)"
    return f"{statistics.mean(values):.3f} (range {min(values):.3f}-{max(values):.3f}, {len(values)} runs)"


PROSE = BENCH / "benchpages" / "prose"  # one Markdown file per page: the text between its figures
_SECTION = re.compile(r"^<!-- section: ([\w-]+) -->$", re.M)
_SLOT = re.compile(r"\{(\w+)\}")


def prose_blocks(slug: str, section: str, values: dict[str, object], folder: Path = PROSE) -> list[str]:
    """The blocks of `section` in `<folder>/<slug>.md`, each on one line as Page.para writes it (a paragraph's
    wrapped lines joined by spaces; a heading as it is), every `{name}` replaced by `values[name]`."""
    parts = _SECTION.split((folder / f"{slug}.md").read_text(encoding="utf-8"))
    sections = dict(zip(parts[1::2], parts[2::2], strict=True))
    if section not in sections:
        raise SystemExit(f"bench/pages.py: no section {section!r} in {folder / slug}.md")

    def fill(match: re.Match[str]) -> str:
        if match.group(1) not in values:
            raise SystemExit(
                f"bench/pages.py: {slug}.md section {section!r} needs a value for {match.group(0)}"
            )
        return str(values[match.group(1)])

    blocks = [block.strip() for block in sections[section].split("\n\n") if block.strip()]
    return [_SLOT.sub(fill, " ".join(line.strip() for line in block.splitlines())) for block in blocks]


@dataclass
class Page:
    slug: str
    title: str
    results: dict[str, Result]
    lines: list[str] = field(default_factory=list)
    cited: list[str] = field(default_factory=list)

    def cite(self, name: str) -> str:
        """The result file `name` in code font; recorded as cited on this page."""
        result = self.results.get(name)
        if result is None:
            raise SystemExit(f"bench/pages.py: page {self.slug} cites {name}.json, which is not in {RESULTS}")
        if result.dirty:
            raise SystemExit(
                f"bench/pages.py: page {self.slug} cites {name}.json, made from uncommitted code"
            )
        if name not in self.cited:
            self.cited.append(name)
        return f"`{name}.json`"

    def r(self, name: str) -> Result:
        self.cite(name)
        return self.results[name]

    def heading(self, level: int, text: str) -> None:
        self.lines += ["#" * level + " " + text, ""]

    def para(self, *text: str) -> None:
        self.lines += [" ".join(part.strip() for part in text), ""]

    def prose(self, section: str, **values: object) -> None:
        """The paragraphs and headings of `section` in this page's prose file, `{name}` filled from `values`."""
        for block in prose_blocks(self.slug, section, values):
            self.lines += [block, ""]

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
        self.lines.append("| " + " | ".join(headers) + " |")
        self.lines.append("| " + " | ".join("---" for _ in headers) + " |")
        for row in rows:
            self.lines.append("| " + " | ".join(str(cell).replace("|", "/") for cell in row) + " |")
        self.lines.append("")

    def image(self, file: str, alt: str) -> None:
        self.lines += [f"![{alt}](img/{file})", ""]

    def text(self) -> str:
        body = "\n".join(self.lines).rstrip() + "\n"
        return f"# {self.title}\n\n<!-- generated by bench/pages.py from bench/results/: do not edit -->\n\n{body}"


RUN_HEADERS = ("seed", "preset", "minutes", "machine", "threads", "steps", "mAP@0.5", "mAP@0.5:0.95", "file")


def run_row(page: Page, name: str, label: str) -> list[object]:
    result = page.r(name)
    return [
        label,
        result.preset,
        f"{result.minutes:g}" if result.minutes else "-",
        result.cpu,
        result.threads,
        count(result.steps),
        f3(result.map50),
        f3(result.final.get("mAP50_95")),
        page.cite(name),
    ]


def save_figure(figure: Any, name: str) -> None:
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    target = IMG / name
    with tempfile.NamedTemporaryFile(dir=IMG, suffix=".png", delete=False) as handle:
        figure.savefig(handle, format="png", dpi=100, metadata={"Software": None})
    os.replace(handle.name, target)
    plt.close(figure)
