"""Side by side with Ultralytics YOLO."""

from __future__ import annotations

from collections.abc import Callable

from .core import (
    Page,
    Result,
    count,
    f2,
    f3,
    save_figure,
    threads_text,
)

PEER_DATA = (  # (key, label, our files, YOLO files)
    (
        "surface",
        "synthetic surfaces",
        [
            "scaling_surface_nano_10min",
            "scaling_surface_nano_30min",
            "scaling_surface_nano_60min",
            "pretrained_surface_tiny_pretrained_10min",
            "scaling_surface_tiny_30min",
            "scaling_surface_tiny_60min",
            "pretrained_surface_scratch_10min",
        ],
        [
            "peers_surface_yolo11n_352px_10min",
            "peers_surface_yolo11n_352px_30min",
            "peers_surface_yolo11n_352px_60min",
            "peers_surface_yolov8n_352px_10min",
            "peers_surface_yolo11n_640px_10min",
        ],
    ),
    (
        "deeppcb_plain",
        "DeepPCB without templates",
        [
            "scaling_deeppcb_plain_nano_10min",
            "scaling_deeppcb_plain_nano_30min",
            "scaling_deeppcb_plain_nano_60min",
            "pretrained_deeppcb_plain_tiny_pretrained_10min",
            "scaling_deeppcb_plain_tiny_30min",
            "scaling_deeppcb_plain_tiny_60min",
        ],
        [
            "peers_deeppcb_plain_yolo11n_640px_10min",
            "peers_deeppcb_plain_yolo11n_640px_30min",
            "peers_deeppcb_plain_yolo11n_640px_60min",
            "peers_deeppcb_plain_yolo11n_320px_10min",
        ],
    ),
    (
        "deeppcb_template",
        "DeepPCB with templates",
        ["scaling_deeppcb_template_nano_10min"],
        ["peers_deeppcb_template_yolo11n_320px_10min"],
    ),
)


def _ours_row(page: Page, name: str) -> list[object]:
    result = page.r(name)
    start = "random weights" if "scratch" in name or "template" in name else "shipped weights"
    size = result.doc.get("settings", {}).get("imgsz") or ladder_sizes(page.results).get(result.file, "-")
    return [
        f"defectdet {result.preset} ({start})",
        size,
        f"{result.minutes or 10:g}",
        result.cpu,
        result.threads,
        f"{count(result.steps)} steps",
        f3(result.map50),
        page.cite(name),
    ]


def ladder_sizes(results: dict[str, Result]) -> dict[str, int]:
    """Input size of each run in the side-by-side summary, as chosen from the data."""
    rows = [row for data in results["peers_ladder"].doc["datasets"].values() for row in data["rows"]]
    return {row["file"]: row["imgsz"] for row in rows}


def _peer_row(page: Page, name: str) -> list[object]:
    result = page.r(name)
    final = result.doc["final_ours_evaluator"]
    model = {"yolo11n": "YOLO11n", "yolov8n": "YOLOv8n"}[result.doc["model"]]
    if "template" in name:
        model += ", template as a second channel"
    return [
        f"{model} (random weights)",
        result.doc["imgsz"],
        f"{result.minutes:g}",
        result.cpu,
        result.threads,
        f"{final['epochs']} epochs",
        f3(final["mAP50"]),
        page.cite(name),
    ]


def page_peers(results: dict[str, Result], plots: list[Callable[[], None]]) -> Page:
    page = Page("peers", "Side by side with Ultralytics YOLO", results)
    ours60 = results["scaling_surface_tiny_60min"].map50
    yolo60 = results["peers_surface_yolo11n_352px_60min"].doc["final_ours_evaluator"]["mAP50"]
    pcb60 = results["scaling_deeppcb_plain_tiny_60min"].map50
    pcb_yolo60 = results["peers_deeppcb_plain_yolo11n_640px_60min"].doc["final_ours_evaluator"]["mAP50"]
    page.prose(
        "what-to-conclude-on-a",
        f3_ours60=f3(ours60),
        f3_yolo60=f3(yolo60),
        f3_pcb60=f3(pcb60),
        f3_pcb_yolo60=f3(pcb_yolo60),
    )
    page.image(
        "peers.png",
        "held-out mAP@0.5 against minutes of training, defectdet and YOLO, with their starting weights",
    )
    plots.append(lambda: plot_peers(results))
    page.prose("the-same-held-out-images")
    for _key, label, ours, peers in PEER_DATA:
        page.heading(2, label)
        rows = [_ours_row(page, name) for name in ours] + [_peer_row(page, name) for name in peers]
        headers = ("model", "input px", "minutes", "machine", "threads", "trained", "mAP@0.5", "file")
        page.table(headers, rows)
    section_peer_latency(page)
    page.prose("the-summary-table-of-all", page_cite_peers_ladder=page.cite("peers_ladder"))
    return page


def section_peer_latency(page: Page) -> None:
    page.heading(2, "Latency at matched input sizes")
    for name in sorted(n for n in page.results if n.startswith("peers_latency")):
        if not page.results[name].dirty:
            _peer_latency_run(page, page.r(name))


def _peer_latency_run(page: Page, result: Result) -> None:
    by_size: dict[int, dict[str, float]] = {}
    for row in result.doc["model_only"]:
        by_size.setdefault(row["imgsz"], {})[row["model"]] = row["p50_ms"]
    ours, theirs = latency_models(result)
    pinned = "one pinned core at " if result.cores == 1 else ""
    page.para(
        f"Model only: ONNX Runtime fp32, batch 1, {pinned}{threads_text(result.threads)}, the calls interleaved, on",
        f"{result.machine} ({page.cite(result.name)}); untrained weights (weights do not change a graph's",
        "cost), each YOLO graph as their exporter writes it from the yaml.",
        end_to_end_text(result.doc.get("end_to_end")),
    )
    rows = [
        [
            size,
            *(f2(m.get(model)) for model in (*ours, *theirs)),
            *(f"{m['yolo11n'] / m[model]:.1f}x" for model in ours if "yolo11n" in theirs),
            result.cpu,
            result.doc["settings"]["threads"],
        ]
        for size, m in sorted(by_size.items())
    ]
    headers = [f"{latency_label(model)} p50 ms" for model in (*ours, *theirs)]
    headers += [f"YOLO11n / {model.removeprefix('defectdet ')}" for model in ours if "yolo11n" in theirs]
    page.table(("input px", *headers, "machine", "threads"), rows)


def latency_models(result: Result) -> tuple[list[str], list[str]]:
    """(our models, YOLO models) in the order the run measured them."""
    names = list(dict.fromkeys(row["model"] for row in result.doc["model_only"]))
    ours = [name for name in names if name.startswith("defectdet ")]
    return ours, [name for name in names if name not in ours]


def latency_label(model: str) -> str:
    """yolo11n -> YOLO11n, yolov8n -> YOLOv8n; ours as named."""
    return "YOLO" + model.removeprefix("yolo") if model.startswith("yolo") else model


def end_to_end_text(end: dict | None) -> str:
    if end is None:
        return "End to end was not measured in this run (it needs trained models: --ours-checkpoint, --yolo-onnx)."
    return " ".join(
        [
            f"End to end at {end['imgsz']} px on {end['images']} held-out surface images (file bytes to boxes): p50",
            f"{f2(end['ours']['e2e_total_p50_ms'])} ms for defectdet nano against",
            f"{f2(end['yolo11n']['e2e_total_p50_ms'])} ms for YOLO11n; p95 {f2(end['ours']['e2e_total_p95_ms'])}",
            f"against {f2(end['yolo11n']['e2e_total_p95_ms'])} ms, because defectdet also runs the largest images",
            "as tiles, which YOLO does not.",
        ]
    )


def plot_peers(results: dict[str, Result]) -> None:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(13, 4))
    for axis, (_, label, ours, peers) in zip(axes, PEER_DATA, strict=True):
        series: dict[str, list[tuple[float, float]]] = {}
        for name in ours:
            result = results[name]
            start = "random weights" if "scratch" in name or "template" in name else "shipped weights"
            series.setdefault(f"defectdet {result.preset} ({start})", []).append(
                (result.minutes or 10.0, result.map50)
            )
        for name in peers:
            doc = results[name].doc
            model = {"yolo11n": "YOLO11n", "yolov8n": "YOLOv8n"}[doc["model"]]
            key = (
                f"{model} {doc['imgsz']} px"
                + (", template channel" if "template" in name else "")
                + " (random weights)"
            )
            series.setdefault(key, []).append((doc["minutes"], doc["final_ours_evaluator"]["mAP50"]))
        for key, points in series.items():
            style = "o-" if key.startswith("defectdet") else "s--"
            axis.plot(*zip(*sorted(points), strict=True), style, label=key)
        axis.set_title(label)
        axis.set_xlabel("minutes of training (one core)")
        axis.set_ylabel("held-out mAP@0.5")
        axis.set_xlim(0, 65)
        axis.set_ylim(0, 1)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    save_figure(figure, "peers.png")
