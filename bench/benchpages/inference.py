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
    page.para(
        f"640 x 640 inputs with a template (2 channels), batch 1, {result.doc['settings']['threads']} threads on",
        f"{result.machine}, {result.doc['settings']['runs']} calls after warm-up ({page.cite(result.name)}).",
        "ONNX Runtime is the runtime `predict`, `serve` and `Predictor` use: nano answers in",
        f"{f2(nano['ort_fp32_p50_ms'])} ms at the median, {f2(nano['e2e_total_p50_ms'])} ms end to end",
        "(decode, letterbox, model, postprocess), and the torch-free runtime process stays near",
        f"{f1(nano.get('rss_rss_after_calls_mb'))} MB after {count(nano.get('rss_calls'))} calls.",
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
    page.para(
        f"int8 (static, per-channel) keeps the accuracy, mAP@0.5 {int8['mAP50_fp32']} → {int8['mAP50_int8']}, but",
        f"on this CPU it is slower: p50 {f2(int8['p50_ms_fp32'])} → {f2(int8['p50_ms_int8'])} ms",
        f"({page.cite('int8')}). `export --int8` keeps the int8 file when it loses at most {int8['max_drop']} mAP@0.5",
        "and warns when it is slower than fp32.",
    )
    tiles = page.r("tiles").doc["latency"]
    page.para(
        "Tiles: on the surface model, images the letterbox shrinks a lot also run as native-resolution tiles;",
        f"those images take p50 {f1(tiles['tiles_off']['tiled_images_ms']['p50'])} ms without tiles and",
        f"{f1(tiles['tiles_on']['tiled_images_ms']['p50'])} ms with them ({page.cite('tiles')}).",
    )
    reg = page.r("registration").doc["timing_ms"]
    reg128 = page.r("registration_work128").doc["timing_ms"]
    page.para(
        "Pair registration (aligning the template to the tested image, on by default with templates) costs",
        f"p50 {f2(reg['gauss_newton']['p50'])} ms per 640 x 640 pair, {f2(reg['gauss_newton_translation_only']['p50'])}",
        f"ms for a shift only ({page.cite('registration')}); at a 128 px working size {f2(reg128['gauss_newton']['p50'])}",
        f"ms, less exact ({page.cite('registration_work128')}).",
    )


def section_flips(page: Page) -> None:
    page.heading(2, "Test-time flips")
    page.para(
        "`export --flip-views lr` (or `lr+ud`) also runs the mirrored image(s) and averages the answers before",
        "NMS: more accuracy for one more model pass per view, no retraining. It helps most where the model is",
        "unsure (synthetic surfaces, DeepPCB without templates) and adds nothing with templates. Where a model",
        "already mistakes the new design's holes for pin-holes, averaging makes it surer of them, so compare the",
        "bundles with `defectdet compare` on the line's own images first. Off by default.",
    )
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
    page.para(
        "A board repeats its design (every pad of a footprint has the same hole) and a defect is where the board",
        "differs from its own repeats. `export --repeat-check` drops a detection whose surroundings match a copy",
        "elsewhere in the same image with no change inside the box; it runs in the torch-free runtime. On DeepPCB",
        f"without templates, with today's defaults, it lifts mAP@0.5 from {spread(plain)} to {spread(checked)},",
        f"and with `lr+ud` flips to {spread(both)}. It costs a few ms per image. Models with templates do not",
        "need it and refuse it. The last column counts the dropped detections that sat on unchanged design",
        "against those that covered a real change (a true defect lost), from the golden templates.",
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
    page.para("The plot of these rows opens this page.")
    surface = page.r("repeat_check_ablate_surface_tiny_10min_seed-5_stop39").doc["arms"]
    page.para(
        "Where nothing repeats, nothing changes: on the synthetic surfaces mAP@0.5 goes",
        f"{f3(surface['none']['plain']['mAP50'])} → {f3(surface['none']['repeat_check']['mAP50'])}",
        f"({page.cite('repeat_check_ablate_surface_tiny_10min_seed-5_stop39')}). How often a labelled defect is",
        "itself called repeated design (a defect lost to the check), per data set:",
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
    page.para(
        "What to conclude: a bundle keeps pace with a line on an ordinary CPU. On a 2-core cloud machine the nano",
        f"model answers a 640 x 640 board with its template in {f2(nano['ort_fp32_p50_ms'])} ms at the median,",
        f"{f2(nano['e2e_total_p50_ms'])} ms from file bytes to boxes. Without templates, two export options buy",
        "accuracy with latency and no retraining: on DeepPCB the repeat check with `lr+ud` flips lifts mAP@0.5",
        f"from {f3(statistics.mean(plain))} to {f3(statistics.mean(both))} (means of {len(runs)} runs). int8",
        f"keeps the accuracy but was slower than fp32 on this CPU ({f2(int8['p50_ms_int8'])} against",
        f"{f2(int8['p50_ms_fp32'])} ms): measure it on yours before you use it. Per-run tables below.",
    )
    page.image(
        "repeat-check.png",
        "held-out mAP@0.5 against p50 latency, with and without flips and the repeat check",
    )
    plots.append(lambda: plot_repeat_check(page.results))


def page_inference(results: dict[str, Result], plots: list[Callable[[], None]]) -> Page:
    page = Page("inference", "Inference", results)
    conclusion_inference(page, plots)
    page.heading(2, "How to read the tables")
    page.para(
        "What a bundle costs per image on a CPU, and the two options that trade latency for accuracy without",
        "retraining. p50 and p95 are the median and 95th-percentile time per call.",
    )
    section_latency(page)
    section_flips(page)
    section_repeat_check(page, plots)
    return page
