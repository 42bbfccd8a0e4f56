"""Training speed page: steps per second, the host memory setting, bf16."""

from __future__ import annotations

from collections.abc import Callable

from .accuracy import CURRENT_DEFAULT_RUNS, PLAIN_20
from .core import (
    Page,
    Result,
    count,
    f1,
    f2,
    f3,
)

BF16_RUNS = (
    PLAIN_20 + "synthetic_boards-0_val_every-None_amp-True_amp_dtype-bfloat16_threads-2_stop40",
    PLAIN_20 + "synthetic_boards-0_val_every-None_amp-True_amp_dtype-bfloat16_seed-1_threads-2_stop40",
)
KEPT_MEMORY = (*CURRENT_DEFAULT_RUNS, *BF16_RUNS)  # trained with freed host memory kept (the default since)
DATA_LABELS = {
    "deeppcb_plain": "DeepPCB without templates",
    "deeppcb_template": "DeepPCB with templates",
    "surface": "surfaces",
}


def data_label(result: Result) -> str:
    if str(result.doc.get("dataset")) in DATA_LABELS:
        return DATA_LABELS[result.doc["dataset"]]
    if "surface" in result.name:
        return "surfaces"
    template = result.doc.get("settings", {}).get("template")
    if template is None:  # chosen from the data: DeepPCB has templates unless the run said --no-template
        template = "notemplate" not in result.name
    return "DeepPCB with templates" if template else "DeepPCB without templates"


SPEED_RUNS = (  # training runs whose steps per second are shown
    "scaling_deeppcb_plain_tiny_20min",
    PLAIN_20 + "synthetic_boards-0_stop38",
    PLAIN_20 + "synthetic_boards-0_threads-2_stop38",
    PLAIN_20 + "synthetic_boards-0_seed-1_stop39",
    PLAIN_20 + "synthetic_boards-0_threads-2_stop39",
    PLAIN_20 + "synthetic_boards-0_val_every-None_threads-2_stop40",
    *CURRENT_DEFAULT_RUNS,
    *BF16_RUNS,
    "scaling_deeppcb_plain_nano_20min",
    "scaling_deeppcb_template_nano_10min",
    "train_deeppcb_nano_20min",
    "train_deeppcb_tiny_20min",
    "scaling_surface_tiny_30min",
    "train_surface_10min",
)


def _speed_note(result: Result) -> str:
    settings = result.doc.get("settings") or {}
    notes = []
    if settings.get("amp"):
        notes.append(str(settings.get("amp_dtype") or "amp"))
    notes.append("freed memory kept" if result.name in KEPT_MEMORY else "freed memory returned")
    if settings.get("val_every"):
        notes.append(f"validation every {settings['val_every']} epochs")
    return ", ".join(notes)


def page_training_speed(results: dict[str, Result], plots: list[Callable[[], None]]) -> Page:
    page = Page("training-speed", "Training speed", results)
    default = [page.results[name] for name in CURRENT_DEFAULT_RUNS]
    rates = [r.steps / r.doc["wall_seconds"] for r in default]
    old = page.results[PLAIN_20 + "synthetic_boards-0_val_every-None_threads-2_stop40"]
    page.prose(
        "what-to-conclude-on-a",
        f2_min_rates=f2(min(rates)),
        f2_max_rates=f2(max(rates)),
        f2_old_steps_old_doc_wall_seconds=f2(old.steps / old.doc["wall_seconds"]),
    )
    page.image("recipe.png", "held-out mAP@0.5 against training steps, one recipe run many times")
    page.prose("steps-per-second-below-are")
    rows = []
    for name in SPEED_RUNS:
        result = page.r(name)
        rows.append(
            [
                data_label(result),
                result.preset,
                f"{result.minutes:g}" if result.minutes else "-",
                result.cpu,
                result.threads,
                _speed_note(result),
                count(result.steps),
                f2(result.steps / result.doc["wall_seconds"]),
                f3(result.map50),
                page.cite(name),
            ]
        )
    headers = (
        "data",
        "preset",
        "minutes",
        "machine",
        "threads",
        "setting",
        "steps",
        "steps/s",
        "mAP@0.5",
        "file",
    )
    page.table(headers, rows)
    section_step_time(page)
    section_host_memory(page)
    section_bf16(page)
    loader = page.r("loader").doc
    page.prose(
        "the-data-loader-alone-one",
        f1_loader_results_0_images_per_s=f1(loader["results"][0]["images_per_s"]),
        f1_loader_cache_0_images_per_s_cached=f1(loader["cache"][0]["images_per_s_cached"]),
        page_results_loader_machine=page.results["loader"].machine,
        page_cite_loader=page.cite("loader"),
    )
    return page


def section_step_time(page: Page) -> None:
    """Seconds per training step of each preset at its default shape (bench/step_speed.py)."""
    page.heading(2, "Step time per preset")
    result = page.results.get("step_speed")
    if result is None or result.dirty:
        page.prose("not-measured-yet-python-m")
        return
    page.cite(result.name)
    lite0 = [r for r in result.doc["results"] if r["preset"] == "lite0" and r.get("frozen_stem")]
    ratios = ", ".join(f"{f2(r['images_per_second_vs_tiny'])} at {r['threads']} thread(s)" for r in lite0)
    page.prose(
        "one-training-step-forward-backward",
        result_machine=result.machine,
        page_cite_result_name=page.cite(result.name),
        ratios=ratios,
    )
    rows = [
        [
            r["shape"],
            r["batch"],
            r["threads"],
            f2(r["seconds_per_step"]),
            f1(r["images_per_second"]),
            f2(r["images_per_second_vs_tiny"]),
        ]
        for r in result.doc["results"]
    ]
    page.table(("preset and input", "batch", "threads", "s/step", "images/s", "images/s vs tiny"), rows)


def section_host_memory(page: Page) -> None:
    page.heading(2, "Host memory setting")
    result = page.r("host_memory_xeon")
    page.prose(
        "a-cpu-training-step-frees",
        result_doc_settings_repeats=result.doc["settings"]["repeats"],
        result_machine=result.machine,
        result_doc_settings_threads=result.doc["settings"]["threads"],
        page_cite_result_name=page.cite(result.name),
    )
    rows = []
    for layout in ("tiny, no template", "nano, template"):
        median = result.doc[layout]["median"]
        a, b = median["default malloc"], median["keep freed memory"]
        rows.append(
            [
                layout,
                f"{f1(a['ms_per_step'])} → {f1(b['ms_per_step'])}",
                f"{count(round(a['page_faults_per_step']))} → {count(round(b['page_faults_per_step']))}",
                f"{f1(a['kernel_ms_per_step'])} → {f1(b['kernel_ms_per_step'])}",
                f"{result.doc[layout]['speedup']:.2f}x",
                result.cpu,
                result.doc["settings"]["threads"],
                page.cite(result.name),
            ]
        )
    headers = (
        "layout",
        "ms per step: returned → kept",
        "page faults per step",
        "kernel ms per step",
        "speed",
    )
    page.table((*headers, "machine", "threads", "file"), rows)


def section_bf16(page: Page) -> None:
    page.heading(2, "bf16 autocast")
    epyc, xeon = page.r("amp_cpu"), page.r("amp_cpu_xeon")
    page.prose(
        "whether-bf16-pays-depends-on",
        xeon_doc_settings_preset=xeon.doc["settings"]["preset"],
        xeon_doc_bf16_speedup=f"{xeon.doc['bf16_speedup']:.2f}",
        epyc_doc_settings_preset=epyc.doc["settings"]["preset"],
        epyc_doc_bf16_speedup=f"{epyc.doc['bf16_speedup']:.2f}",
    )
    rows = []
    for result in (epyc, xeon):
        settings = result.doc["settings"]
        steps = result.doc["ms_per_step"]
        rows.append(
            [
                settings["preset"],
                result.cpu,
                settings["threads"],
                f1(steps["fp32"]),
                f1(steps["bf16"]),
                f"{result.doc['bf16_speedup']:.2f}x",
                page.cite(result.name),
            ]
        )
    page.table(("preset", "machine", "threads", "fp32 ms/step", "bf16 ms/step", "bf16 speed", "file"), rows)
