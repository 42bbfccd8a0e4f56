"""Write the benchmark pages of the documentation site from the result files in bench/results/.

Every figure on docs/benchmarks/*.md and in docs/benchmarks/img/*.png is read from a result file here; the
prose between the tables says what the figures mean, with the figures themselves inserted from the files. The
prose lives in bench/benchpages/prose/<page>.md (`Page.prose` fills in a section's `{name}` slots).
A result file whose run recorded uncommitted code is listed in the manifest but kept off the pages.

Run: python -m bench.pages            (writes the pages and plots)
     python -m bench.pages --check    (exit 1 when a committed page differs from what the files give)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.benchpages.accuracy import (
    CURRENT_DEFAULT_RUNS,
    SURFACE_SEEDS,
    page_accuracy,
)
from bench.benchpages.core import (
    NOT_CODE,
    OUT,
    PAGES,
    RESULTS,
    ROOT,
    Page,
    Result,
    command_of,
    f1,
    f2,
    f3,
    load_results,
    script_of,
    threads_text,
)
from bench.benchpages.inference import page_inference
from bench.benchpages.peers import page_peers
from bench.benchpages.service import page_service
from bench.benchpages.speed import page_training_speed
from bench.pages_realdata import page_real_data

__all__ = [
    "Page",
    "Result",
    "build",
    "build_pages",
    "load_results",
    "script_of",
    "DERIVED_FROM_UNCOMMITTED",
    "RESULTS",
]


def page_index(results: dict[str, Result], plots: list[Callable[[], None]]) -> Page:
    page = Page("index", "Benchmarks", results)
    page.prose("what-to-conclude-on-a")
    page.image(
        "peers.png", "held-out mAP@0.5 against minutes of training on one CPU core, defectdet and YOLO"
    )
    page.prose("every-figure-in-these-pages")
    nano = results["train_deeppcb_nano_20min"]
    current = [page.results[name] for name in CURRENT_DEFAULT_RUNS]
    checked = [
        results["repeat_check_" + name].doc["arms"]["lr+ud"]["repeat_check"]["mAP50"]
        for name in CURRENT_DEFAULT_RUNS
    ]
    surfaces = [results[name] for name in SURFACE_SEEDS["tiny"][:6]]
    ours, yolo = results["scaling_surface_tiny_60min"], results["peers_surface_yolo11n_352px_60min"]
    latency = results["latency"].doc["results"][0]
    load = results["serve_load"]
    rows = [
        [
            "DeepPCB with templates, held-out boards",
            "nano",
            "20",
            nano.cpu,
            nano.threads,
            f"mAP@0.5 {f3(nano.map50)}",
            "[accuracy](accuracy.md)",
        ],
        [
            "DeepPCB without templates, held-out boards",
            "tiny",
            "20",
            current[0].cpu,
            current[0].threads,
            f"mAP@0.5 {f3(statistics.mean(r.map50 for r in current))} (mean of {len(current)} runs); "
            f"{f3(statistics.mean(checked))} with the repeat check and flips",
            "[accuracy](accuracy.md), [inference](inference.md)",
        ],
        [
            "synthetic surfaces, held-out images",
            "tiny",
            "10",
            surfaces[0].cpu,
            surfaces[0].threads,
            f"mAP@0.5 {f3(statistics.mean(r.map50 for r in surfaces))} (mean of {len(surfaces)} seeds)",
            "[accuracy](accuracy.md)",
        ],
        [
            "defectdet from its shipped weights against YOLO11n from random weights, synthetic surfaces",
            "tiny",
            "60",
            ours.cpu,
            ours.threads,
            f"mAP@0.5 {f3(ours.map50)} against {f3(yolo.doc['final_ours_evaluator']['mAP50'])}",
            "[peers](peers.md)",
        ],
        [
            "latency, 640 x 640 with template, ONNX Runtime",
            "nano",
            "-",
            page.results["latency"].cpu,
            page.results["latency"].threads,
            f"p50 {f2(latency['ort_fp32_p50_ms'])} ms, {f2(latency['e2e_total_p50_ms'])} ms end to end",
            "[inference](inference.md)",
        ],
        [
            "`serve`, 640 x 640 image and template per request",
            "nano",
            "-",
            load.cpu,
            "2",
            f"{f1(load.doc['steady']['requests_per_s'])} requests/s, no error",
            "[service](service.md)",
        ],
    ]
    page.heading(2, "At a glance")
    page.table(("what", "preset", "minutes of training", "machine", "threads", "figure", "page"), rows)
    page.heading(2, "Pages")
    page.table(
        ("page", "what it measures"),
        [
            [
                "[Accuracy](accuracy.md)",
                "DeepPCB with and without templates, synthetic surfaces, accuracy against "
                "minutes of training, shipped starting weights against random, clean boards",
            ],
            ["[Peers](peers.md)", "side by side with Ultralytics YOLO at the same budgets"],
            ["[Inference](inference.md)", "latency p50/p95, int8, test-time flips, the repeat check"],
            ["[Service](service.md)", "`serve` under load and abuse, the loop on a shifted line"],
            ["[Training speed](training-speed.md)", "steps per second, the host memory setting, bf16"],
            [
                "[Real data](real-data.md)",
                "real aircraft glass (AGDD) and PCBs (DeepPCB) with the defaults, beside published results",
            ],
            ["[Result files](manifest.md)", "every result file: command, commit, machine, where it is cited"],
        ],
    )
    page.prose("map-0-5-is-the")
    kept_off = [r for name, r in results.items() if r.dirty or name in DERIVED_FROM_UNCOMMITTED]
    page.prose("how-many-result-files", len_results=len(results), len_kept_off=len(kept_off))
    return page


DERIVED_FROM_UNCOMMITTED = {"gpu": ("gpu_deeppcb_template", "gpu_surface")}


def status_of(result: Result, cited: list[str], results: dict[str, Result]) -> str:
    if result.dirty:
        code = [p for p in result.uncommitted or [] if not p.endswith(NOT_CODE)]
        named = ", ".join(f"`{p}`" for p in code) or "the file says `dirty: true`"
        return f"kept off the pages: made from uncommitted code ({named})"
    if result.name in DERIVED_FROM_UNCOMMITTED:
        sources = ", ".join(f"`{n}.json`" for n in DERIVED_FROM_UNCOMMITTED[result.name])
        return f"kept off the pages: summarises {sources}, made from uncommitted code"
    if not cited:
        return "not cited"
    note = ""
    if result.uncommitted:
        note = (
            " (uncommitted when it ran: " + ", ".join(f"`{p}`" for p in result.uncommitted) + ", its output)"
        )
    elif result.uncommitted is None:
        note = " (older file: uncommitted code not recorded)"
    return "on the pages" + note


def page_manifest(results: dict[str, Result], cited: dict[str, list[str]]) -> Page:
    page = Page("manifest", "Result files", results)
    page.prose("intro")
    rows = []
    for name, result in results.items():
        command, recorded = command_of(result)
        pages = ", ".join(f"[{p}]({p}.md)" for p in cited.get(name, []))
        rows.append(
            [
                f"`{result.file}`",
                f"`{command}`" + ("" if recorded else " (derived)"),
                f"`{result.commit}`",
                f"{result.cpu}, {threads_text(result.threads)}",
                result.date,
                pages or "-",
                status_of(result, cited.get(name, []), results),
            ]
        )
    page.table(("file", "command", "commit", "machine", "date", "cited on", "status"), rows)
    return page


BUILDERS: dict[str, Callable[[dict[str, Result], list[Callable[[], None]]], Page]] = {
    "index": page_index,
    "accuracy": page_accuracy,
    "peers": page_peers,
    "inference": page_inference,
    "service": page_service,
    "training-speed": page_training_speed,
    "real-data": page_real_data,
}


def build_pages(results: dict[str, Result] | None = None) -> tuple[dict[str, Page], list[Callable[[], None]]]:
    """Every page (slug -> Page, each knowing the result files it cites), and the plots to draw."""
    results = results if results is not None else load_results()
    plots: list[Callable[[], None]] = []
    pages = {slug: builder(results, plots) for slug, builder in BUILDERS.items()}
    cited: dict[str, list[str]] = {}
    for slug, page in pages.items():
        for name in page.cited:
            cited.setdefault(name, []).append(slug)
    pages["manifest"] = page_manifest(results, cited)
    return {slug: pages[slug] for slug in (*PAGES, "real-data")}, plots


def build(results: dict[str, Result] | None = None) -> tuple[dict[str, str], list[Callable[[], None]]]:
    """Page file name -> markdown, and the plots to draw."""
    pages, plots = build_pages(results)
    return {f"{slug}.md": page.text() for slug, page in pages.items()}, plots


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, suffix=".tmp", delete=False, encoding="utf-8"
    ) as handle:
        handle.write(text)
    os.replace(handle.name, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--check", action="store_true", help="compare with the committed pages, write nothing"
    )
    args = parser.parse_args(argv)
    pages, plots = build()
    if args.check:
        stale = [
            name
            for name, text in pages.items()
            if not (OUT / name).is_file() or (OUT / name).read_text(encoding="utf-8") != text
        ]
        for name in stale:
            print(f"docs/benchmarks/{name} is stale: run python -m bench.pages", file=sys.stderr)
        return 1 if stale else 0
    import matplotlib

    matplotlib.use("Agg")
    for name, text in pages.items():
        write_atomic(OUT / name, text)
    for plot in plots:
        plot()
    print(f"wrote {len(pages)} pages and {len(plots)} plots to {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
