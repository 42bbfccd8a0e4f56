"""Result files, figure formatting and the page builder shared by every benchmark page."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
        settings = self.doc.get("settings") or {}
        return int((self.doc.get("overrides") or {}).get("seed", settings.get("seed", 0)) or 0)

    def class_ap(self, name: str) -> float | None:
        return (self.doc.get("held_out_per_class_AP50") or {}).get(name)


def load_results(folder: Path = RESULTS) -> dict[str, Result]:
    results = {}
    for path in sorted(folder.glob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise SystemExit(f"{path}: not JSON ({error})") from error
        results[path.stem] = Result(path.stem, doc)
    return results


def script_of(result: Result) -> str | None:
    """The bench script that wrote a result file: named in its command, else the longest script-name prefix."""
    words = str(result.doc.get("command") or "").split()
    for word in words:
        if word.startswith("bench.") and "-m" in words:  # python -m bench.<name>
            return f"bench/{word.removeprefix('bench.')}.py"
        if word.startswith("bench/") and word.endswith(".py"):
            return word
    command = " ".join(words)
    if command.startswith("defectdet "):
        return None
    stems = sorted((p.stem for p in BENCH.glob("*.py")), key=len, reverse=True)
    for stem in stems:
        if result.name == stem or result.name.startswith(stem + "_"):
            return f"bench/{stem}.py"
    return None


def module_of(script: str) -> str:
    """`bench/latency.py` -> `bench.latency`: scripts run as modules of the bench package."""
    return script.removesuffix(".py").replace("/", ".")


def command_of(result: Result) -> tuple[str, bool]:
    """(command, recorded): the recorded command, else one derived from the script and the settings the file
    recorded (each setting the script has an option for)."""
    command = result.doc.get("command")
    if command:
        return str(command), True
    script = script_of(result)
    if script is None or not (ROOT / script).is_file():
        return f"python -m {module_of(script or 'bench/?.py')}", False
    source = (ROOT / script).read_text(encoding="utf-8")
    settings = dict(result.doc.get("settings") or {})
    settings.setdefault("preset", result.doc.get("preset"))
    settings["minutes"] = settings.pop("time_minutes", None) or result.doc.get("minutes")
    parts = [f"python -m {module_of(script)}"]
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if value is None or isinstance(value, dict | list):
            continue
        if isinstance(value, bool):
            flag = flag if value else "--no-" + key.replace("_", "-")
            parts += [flag] if f'"{flag}"' in source else []
        elif f'"{flag}"' in source:
            parts.append(f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}")
    if "final" not in result.doc and "settings" not in result.doc and '"--summary"' in source:
        parts.append("--summary")
    return " ".join(parts), False


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
