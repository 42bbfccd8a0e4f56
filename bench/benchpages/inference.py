"""Inference page: latency, int8, tiles, registration, test-time flips, the repeat check."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from .accuracy import CURRENT_DEFAULT_RUNS
from .core import (
    Page,
    Result,
    count,
    f1,
    f2,
    f3,
    pct,
    save_figure,
    spread,
    trained_on,
)

FLIP_RUNS = (
    ("flip_views_new_design_tiny_control_20min_threads-2", "DeepPCB no template, tiny, 20 min (171 pairs)"),
    ("flip_views_new_design_tiny_clean_20min_threads-2", "the same + 40 golden images of the new design"),
    ("flip_views_ablate_deeppcb_plain_tiny_20min_seed-5", "DeepPCB no template, tiny, 20 min, seed 5"),
    (
        "flip_views_ablate_deeppcb_plain_tiny_20min_seed-5_threads-2",
        "DeepPCB no template, tiny, 20 min, seed 5",
    ),
    (
        "flip_views_ablate_deeppcb_plain_tiny_20min_synthetic_boards-0_threads-2_stop38",
        "DeepPCB no template, tiny, 20 min",
    ),
    (
        "flip_views_ablate_deeppcb_plain_tiny_20min_synthetic_boards-0_seed-1_stop38",
        "DeepPCB no template, tiny, 20 min, seed 1",
    ),
    (
        "flip_views_ablate_deeppcb_plain_tiny_20min_synthetic_boards-400_synthetic_boards_mode-design_threads-2",
        "the same with 400 synthetic board designs",
    ),
    (
        "flip_views_ablate_deeppcb_plain_tiny_20min_synthetic_boards-400_synthetic_boards_mode-design_seed-1",
        "the same with 400 synthetic board designs, seed 1",
    ),
    ("flip_views_ablate_surface_tiny_10min_seed-5", "synthetic surfaces, tiny, 10 min, seed 5"),
    ("flip_views_ablate_deeppcb_template_nano_10min_seed-1", "DeepPCB with templates, nano, 10 min, seed 1"),
)
REPEAT_PREFIX = "repeat_check_ablate_deeppcb_plain_tiny_20min_synthetic_boards-"
REPEAT_RUNS = (
    (REPEAT_PREFIX + "0_val_every-None_threads-2_keep_stop40", "defaults"),
    (REPEAT_PREFIX + "0_val_every-None_threads-2_stop41", "defaults"),
    (REPEAT_PREFIX + "0_val_every-None_seed-1_threads-2_stop41", "defaults, seed 1"),
    (REPEAT_PREFIX + "0_val_every-None_amp-True_amp_dtype-bfloat16_threads-2_stop40", "bf16 training"),
    (
        REPEAT_PREFIX + "0_val_every-None_amp-True_amp_dtype-bfloat16_seed-1_threads-2_stop40",
        "bf16 training, seed 1",
    ),
    (REPEAT_PREFIX + "0_val_every-None_threads-2_stop40", "validation as `train` does, memory not kept"),
    (REPEAT_PREFIX + "0_threads-2_stop39", "validation every 2 epochs"),
    (REPEAT_PREFIX + "0_seed-1_threads-2_stop39", "validation every 2 epochs, seed 1"),
    (REPEAT_PREFIX + "0_seed-1_stop39", "one core, seed 1"),
    (REPEAT_PREFIX + "400_synthetic_boards_mode-design_threads-2_stop39", "400 synthetic board designs"),
)
REPEAT_LABELS = (
    ("repeat_check_labels_deeppcb_train", "DeepPCB training groups"),
    ("repeat_check_labels_boards_color_train_synth-boards_color", "synthetic colour boards"),
    ("repeat_check_labels_steel_train_synth-steel", "synthetic rolled steel"),
    ("repeat_check_labels_weave_train_synth-weave", "synthetic weave"),
    ("repeat_check_labels_tile_train_synth-tile", "synthetic tiles"),
)


def section_latency(page: Page) -> None:
    page.heading(2, "Latency")
    result = page.r("latency")
    rows = []
    for row in result.doc["results"]:
        rows.append(
            [
                row["preset"],
                count(row["params"]),
                f2(row["gflops"]),
                f2(row["ort_fp32_p50_ms"]),
                f2(row["ort_fp32_p95_ms"]),
                f2(row.get("compile_p50_ms")),
                f2(row.get("eager_p50_ms")),
                f2(row.get("openvino_fp32_p50_ms")),
                f2(row.get("e2e_total_p50_ms")),
                f2(row.get("e2e_total_p95_ms")),
            ]
        )
    nano = result.doc["results"][0]
    page.prose(
        "640-x-640-inputs-with",
        result_doc_settings_threads=result.doc["settings"]["threads"],
        result_machine=result.machine,
        result_doc_settings_runs=result.doc["settings"]["runs"],
        page_cite_result_name=page.cite(result.name),
        f2_nano_ort_fp32_p50_ms=f2(nano["ort_fp32_p50_ms"]),
        f2_nano_e2e_total_p50_ms=f2(nano["e2e_total_p50_ms"]),
        f1_nano_get_rss_rss_after_calls_mb=f1(nano.get("rss_rss_after_calls_mb")),
        count_nano_get_rss_calls=count(nano.get("rss_calls")),
    )
    headers = (
        "preset",
        "parameters",
        "GFLOPs",
        "ONNX Runtime p50 ms",
        "p95 ms",
        "torch.compile p50 ms",
        "eager torch p50 ms",
        "OpenVINO p50 ms",
        "end to end p50 ms",
        "end to end p95 ms",
        "machine",
        "threads",
    )
    page.table(headers, [[*row, result.cpu, result.doc["settings"]["threads"]] for row in rows])
    int8 = page.r("int8").doc["result"]
    page.prose(
        "int8-static-per-channel-keeps",
        int8_map50_fp32=int8["mAP50_fp32"],
        int8_map50_int8=int8["mAP50_int8"],
        f2_int8_p50_ms_fp32=f2(int8["p50_ms_fp32"]),
        f2_int8_p50_ms_int8=f2(int8["p50_ms_int8"]),
        page_cite_int8=page.cite("int8"),
        int8_max_drop=int8["max_drop"],
    )
    tiles = page.r("tiles").doc["latency"]
    page.prose(
        "tiles-on-the-surface-model",
        f1_tiles_tiles_off_tiled_images_ms_p50=f1(tiles["tiles_off"]["tiled_images_ms"]["p50"]),
        f1_tiles_tiles_on_tiled_images_ms_p50=f1(tiles["tiles_on"]["tiled_images_ms"]["p50"]),
        page_cite_tiles=page.cite("tiles"),
    )
    reg = page.r("registration").doc["timing_ms"]
    reg128 = page.r("registration_work128").doc["timing_ms"]
    page.prose(
        "pair-registration-aligning-the-template",
        f2_reg_gauss_newton_p50=f2(reg["gauss_newton"]["p50"]),
        f2_reg_gauss_newton_translation_only_p50=f2(reg["gauss_newton_translation_only"]["p50"]),
        page_cite_registration=page.cite("registration"),
        f2_reg128_gauss_newton_p50=f2(reg128["gauss_newton"]["p50"]),
        page_cite_registration_work128=page.cite("registration_work128"),
    )


def section_flips(page: Page) -> None:
    page.prose("export-flip-views-lr-or")
    rows = []
    for name, label in FLIP_RUNS:
        result = page.r(name)
        arms = result.doc["arms"]
        source = page.results.get(name.removeprefix("flip_views_"))
        rows.append(
            [
                label,
                result.cpu,
                result.threads,
                trained_on(source),
                " → ".join(f3(arms[v]["mAP50"]) for v in ("none", "lr", "lr+ud")),
                " → ".join(f1(arms[v]["latency_ms"]["p50"]) for v in ("none", "lr", "lr+ud")),
                " → ".join(f1(arms[v]["latency_ms"]["p95"]) for v in ("none", "lr", "lr+ud")),
                page.cite(name),
            ]
        )
    headers = (
        "model (final weights)",
        "timed on",
        "threads",
        "training",
        "mAP@0.5: none → lr → lr+ud",
        "p50 ms",
        "p95 ms",
        "file",
    )
    page.table(headers, rows)


def plot_repeat_check(results: dict[str, Result]) -> None:
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    options = (
        ("none", "plain", "plain"),
        ("none", "repeat_check", "repeat check"),
        ("lr+ud", "plain", "lr+ud flips"),
        ("lr+ud", "repeat_check", "repeat check + lr+ud flips"),
    )
    for view, check, label in options:
        points = [results["repeat_check_" + name].doc["arms"][view][check] for name in CURRENT_DEFAULT_RUNS]
        axis.scatter(
            [p["latency_ms"]["p50"] for p in points], [p["mAP50"] for p in points], label=label, s=40
        )
    axis.set_xlabel("Predictor p50 ms per image (Intel Xeon, 2 threads)")
    axis.set_ylabel("held-out mAP@0.5")
    axis.set_title("DeepPCB without templates, tiny, 20 min: today's defaults, 3 runs")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    save_figure(figure, "repeat-check.png")


def section_repeat_check(page: Page, plots: list[Callable[[], None]]) -> None:
    page.heading(2, "Repeat check")
    runs = [page.results[name] for name, _ in REPEAT_RUNS[:3]]
    plain = [r.doc["arms"]["none"]["plain"]["mAP50"] for r in runs]
    checked = [r.doc["arms"]["none"]["repeat_check"]["mAP50"] for r in runs]
    both = [r.doc["arms"]["lr+ud"]["repeat_check"]["mAP50"] for r in runs]
    page.prose(
        "a-board-repeats-its-design",
        spread_plain=spread(plain),
        spread_checked=spread(checked),
        spread_both=spread(both),
    )
    rows = []
    for name, label in REPEAT_RUNS:
        result = page.r(name)
        source = page.results.get(name.removeprefix("repeat_check_"))
        for view in ("none", "lr+ud"):
            arm = result.doc["arms"][view]
            rows.append(
                [
                    label,
                    result.cpu,
                    result.threads,
                    trained_on(source),
                    view,
                    f"{f3(arm['plain']['mAP50'])} → {f3(arm['repeat_check']['mAP50'])}",
                    f"{f3(arm['plain']['class_AP50']['pin-hole'])} → {f3(arm['repeat_check']['class_AP50']['pin-hole'])}",
                    f"{f1(arm['plain']['latency_ms']['p50'])} → {f1(arm['repeat_check']['latency_ms']['p50'])}",
                    f"{arm['dropped']['dropped_on_unchanged_design']} / {arm['dropped']['dropped_on_change']}"
                    if arm.get("dropped")
                    else "-",
                    page.cite(name),
                ]
            )
    headers = (
        "run (tiny, 20 min, DeepPCB without templates)",
        "timed on",
        "threads",
        "training",
        "flips",
        "mAP@0.5: off → check",
        "pin-hole",
        "p50 ms",
        "dropped: on design / on a change",
        "file",
    )
    page.table(headers, rows)
    page.prose("the-plot-of-these-rows")
    surface = page.r("repeat_check_ablate_surface_tiny_10min_seed-5_stop39").doc["arms"]
    page.prose(
        "where-nothing-repeats-nothing-changes",
        f3_surface_none_plain_map50=f3(surface["none"]["plain"]["mAP50"]),
        f3_surface_none_repeat_check_map50=f3(surface["none"]["repeat_check"]["mAP50"]),
        page_cite_repeat_check_ablate_surface_ti=page.cite(
            "repeat_check_ablate_surface_tiny_10min_seed-5_stop39"
        ),
    )
    rows = []
    for name, label in REPEAT_LABELS:
        result = page.r(name)
        labelled = result.doc["labelled_defects"]
        worst = [
            item for item in sorted(labelled["by_class"].items(), key=lambda item: -item[1])[:2] if item[1]
        ]
        rows.append(
            [
                label,
                count(labelled["boxes"]),
                pct(labelled["share_called_repeated"]),
                ", ".join(f"{c} {pct(v)}" for c, v in worst),
                result.cpu,
                page.cite(name),
            ]
        )
    page.table(
        ("data (training split)", "labelled boxes", "called repeated", "classes most hit", "machine", "file"),
        rows,
    )


def conclusion_inference(page: Page, plots: list[Callable[[], None]]) -> None:
    """What a user should take from the page, with the plot of accuracy against latency."""
    nano = page.r("latency").doc["results"][0]
    int8 = page.r("int8").doc["result"]
    runs = [page.r(name) for name, _ in REPEAT_RUNS[:3]]
    plain = [r.doc["arms"]["none"]["plain"]["mAP50"] for r in runs]
    both = [r.doc["arms"]["lr+ud"]["repeat_check"]["mAP50"] for r in runs]
    page.prose(
        "what-to-conclude-a-bundle",
        f2_nano_ort_fp32_p50_ms=f2(nano["ort_fp32_p50_ms"]),
        f2_nano_e2e_total_p50_ms=f2(nano["e2e_total_p50_ms"]),
        f3_statistics_mean_plain=f3(statistics.mean(plain)),
        f3_statistics_mean_both=f3(statistics.mean(both)),
        len_runs=len(runs),
        f2_int8_p50_ms_int8=f2(int8["p50_ms_int8"]),
        f2_int8_p50_ms_fp32=f2(int8["p50_ms_fp32"]),
    )
    page.image(
        "repeat-check.png",
        "held-out mAP@0.5 against p50 latency, with and without flips and the repeat check",
    )
    plots.append(lambda: plot_repeat_check(page.results))


def page_inference(results: dict[str, Result], plots: list[Callable[[], None]]) -> Page:
    page = Page("inference", "Inference", results)
    conclusion_inference(page, plots)
    page.prose("what-a-bundle-costs-per")
    section_latency(page)
    section_flips(page)
    section_repeat_check(page, plots)
    return page
