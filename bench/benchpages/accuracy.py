"""Accuracy page: DeepPCB with and without templates, surfaces, minutes of training, starting weights."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from .core import (
    RUN_HEADERS,
    Page,
    Result,
    count,
    f2,
    f3,
    minutes_of,
    run_row,
    save_figure,
    spread,
    threads_text,
)

TEMPLATE_RUNS = (
    "train_deeppcb_nano_20min",
    "train_deeppcb_tiny_20min",
    "train_deeppcb_tiny_10min",
    "train_deeppcb_small_10min",
    "scaling_deeppcb_template_nano_10min",
    "ablate_deeppcb_template_nano_10min_seed-1",
    "scaling_deeppcb_template_nano_60min",
)

# DeepPCB without templates, tiny, 20 minutes, no synthetic boards, fp32: the same recipe run many times
PLAIN_20 = "ablate_deeppcb_plain_tiny_20min_"
PLAIN_RECIPE_RUNS = (
    ("scaling_deeppcb_plain_tiny_20min", ""),
    ("train_deeppcb_tiny_20min_notemplate", ""),
    (PLAIN_20 + "synthetic_boards-0", ""),
    (PLAIN_20 + "synthetic_boards-0_seed-1", ""),
    (PLAIN_20 + "synthetic_boards-0_seed-2", ""),
    (PLAIN_20 + "synthetic_boards-0_seed-3", ""),
    (PLAIN_20 + "seed-5", ""),
    (PLAIN_20 + "synthetic_boards-0_stop38", ""),
    (PLAIN_20 + "synthetic_boards-0_seed-1_stop38", ""),
    (PLAIN_20 + "synthetic_boards-0_threads-2", ""),
    (PLAIN_20 + "synthetic_boards-0_threads-2_stop38", ""),
    (PLAIN_20 + "seed-5_threads-2", ""),
    (PLAIN_20 + "synthetic_boards-0_seed-1_stop39", ""),
    (PLAIN_20 + "synthetic_boards-0_threads-2_stop39", ""),
    (PLAIN_20 + "synthetic_boards-0_seed-1_threads-2_stop39", ""),
    (PLAIN_20 + "synthetic_boards-0_val_every-None_threads-2_stop40", "validation as `train` does"),
    (PLAIN_20 + "synthetic_boards-0_val_every-None_threads-2_keep_stop40", "defaults"),
    (PLAIN_20 + "synthetic_boards-0_val_every-None_threads-2_stop41", "defaults"),
    (PLAIN_20 + "synthetic_boards-0_val_every-None_seed-1_threads-2_stop41", "defaults"),
)
CURRENT_DEFAULT_RUNS = (
    PLAIN_20 + "synthetic_boards-0_val_every-None_threads-2_keep_stop40",
    PLAIN_20 + "synthetic_boards-0_val_every-None_threads-2_stop41",
    PLAIN_20 + "synthetic_boards-0_val_every-None_seed-1_threads-2_stop41",
)


def section_templates(page: Page) -> None:
    page.heading(2, "DeepPCB with templates")
    nano, tiny = page.r("train_deeppcb_nano_20min"), page.r("train_deeppcb_tiny_20min")
    slowest = max(run.doc["time_to"]["time_to_mAP50_0.95_s"] for run in (nano, tiny))
    page.prose(
        "each-deeppcb-board-comes-with",
        f3_nano_map50=f3(nano.map50),
        f3_tiny_map50=f3(tiny.map50),
        minutes_of_slowest=minutes_of(slowest),
    )
    rows = []
    for name in TEMPLATE_RUNS:
        row = run_row(page, name, str(page.results[name].seed()))
        time_to = page.results[name].doc.get("time_to") or {}
        row.insert(-1, minutes_of(time_to.get("time_to_mAP50_0.95_s")))
        rows.append(row)
    page.table((*RUN_HEADERS[:-1], "minutes to 0.95", "file"), rows)
    plain_nano, plain_tiny = (
        page.r("train_deeppcb_nano_20min_notemplate"),
        page.r("train_deeppcb_tiny_20min_notemplate"),
    )
    page.prose(
        "the-same-two-20-minute",
        f3_plain_nano_map50=f3(plain_nano.map50),
        page_cite_plain_nano_name=page.cite(plain_nano.name),
        f3_plain_tiny_map50=f3(plain_tiny.map50),
        page_cite_plain_tiny_name=page.cite(plain_tiny.name),
    )
    boards = page.r("ablate_deeppcb_template_nano_10min_synthetic_boards-400")
    rung = page.results["scaling_deeppcb_template_nano_10min"]
    page.prose(
        "synthetic-boards-do-not-help",
        f3_boards_map50=f3(boards.map50),
        f3_rung_map50=f3(rung.map50),
        page_cite_boards_name=page.cite(boards.name),
    )


def plot_recipe(results: dict[str, Result]) -> None:
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    groups: dict[str, list[Result]] = {}
    for name, _ in PLAIN_RECIPE_RUNS:
        result = results[name]
        groups.setdefault(f"{result.cpu}, {threads_text(result.threads)}", []).append(result)
    for label, runs in groups.items():
        axis.scatter([r.steps for r in runs], [r.map50 for r in runs], label=label, s=40)
    axis.set_xlabel("optimizer steps in 20 minutes")
    axis.set_ylabel("held-out mAP@0.5")
    axis.set_title("DeepPCB without templates, tiny, 20 minutes: every run")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    save_figure(figure, "recipe.png")


def _recipe_groups(page: Page) -> dict[str, list[Result]]:
    groups: dict[str, list[Result]] = {}
    for name, _ in PLAIN_RECIPE_RUNS:
        result = page.results[name]
        groups.setdefault(f"{result.cpu}, {threads_text(result.threads)}", []).append(result)
    return groups


def section_plain_recipe(page: Page, plots: list[Callable[[], None]]) -> None:
    page.heading(2, "DeepPCB without templates: one recipe, many runs")
    current = [page.results[name] for name in CURRENT_DEFAULT_RUNS]
    page.prose("without-a-template-the-model", current_spread=spread([r.map50 for r in current]))
    rows = []
    for group, results in _recipe_groups(page).items():
        steps = [r.steps for r in results if r.steps]
        rows.append([group, f"{count(min(steps))}-{count(max(steps))}", spread([r.map50 for r in results])])
    page.table(("machine", "steps", "held-out mAP@0.5 (every run in the next table)"), rows)
    rows = []
    for name, note in PLAIN_RECIPE_RUNS:
        result = page.r(name)
        rows.append(
            [
                f"seed {result.seed()}" + (f", {note}" if note else ""),
                result.cpu,
                result.threads,
                count(result.steps),
                f3(result.map50),
                f3(result.class_ap("pin-hole")),
                f3(result.class_ap("spur")),
                page.cite(name),
            ]
        )
    page.table(("run", "machine", "threads", "steps", "mAP@0.5", "pin-hole", "spur", "file"), rows)
    page.image("recipe.png", "held-out mAP@0.5 against training steps, one recipe run many times")
    plots.append(lambda: plot_recipe(page.results))
    page.prose("pin-hole-is-the-class")


BOARDS_RUNS = (  # (file, what trains beside the labelled images)
    ("ablate_deeppcb_plain_tiny_10min_synthetic_boards-0", "none"),
    ("ablate_deeppcb_plain_tiny_10min_synthetic_boards-400", "400 boards"),
    (PLAIN_20 + "synthetic_boards-0", "none"),
    (PLAIN_20 + "synthetic_boards-200", "200 boards"),
    (PLAIN_20 + "synthetic_boards-400", "400 boards"),
    (PLAIN_20 + "synthetic_boards-800", "800 boards"),
    (PLAIN_20 + "synthetic_boards-0_seed-1", "none"),
    (PLAIN_20 + "synthetic_boards-400_seed-1", "400 boards"),
    (PLAIN_20 + "synthetic_boards-0_seed-2", "none"),
    (PLAIN_20 + "synthetic_boards-400_seed-2", "400 boards"),
    (PLAIN_20 + "synthetic_boards-0_seed-3", "none"),
    (PLAIN_20 + "synthetic_boards-400_seed-3", "400 boards"),
    (PLAIN_20 + "synthetic_boards-0_stop38", "none"),
    (PLAIN_20 + "synthetic_boards-400_stop38", "400 boards"),
    (PLAIN_20 + "synthetic_boards-400_synthetic_boards_mode-design", "400 board designs"),
    (PLAIN_20 + "synthetic_boards-200_synthetic_boards_mode-both", "200 boards and their designs"),
    (PLAIN_20 + "synthetic_boards-0_seed-1_stop38", "none"),
    (PLAIN_20 + "synthetic_boards-400_synthetic_boards_mode-design_seed-1", "400 board designs"),
    (PLAIN_20 + "synthetic_boards-400_synthetic_boards_mode-design_seed-2", "400 board designs"),
    (PLAIN_20 + "synthetic_boards-0_threads-2", "none"),
    (PLAIN_20 + "synthetic_boards-400_threads-2", "400 boards"),
    (PLAIN_20 + "synthetic_boards-0_threads-2_stop38", "none"),
    (PLAIN_20 + "synthetic_boards-400_synthetic_boards_mode-design_threads-2", "400 board designs"),
    (PLAIN_20 + "synthetic_boards-0_threads-2_stop39", "none"),
    (PLAIN_20 + "synthetic_boards-400_synthetic_boards_mode-design_threads-2_stop39", "400 board designs"),
    ("scaling_deeppcb_plain_tiny_30min", "none"),
    ("ablate_deeppcb_plain_tiny_30min_synthetic_boards-400", "400 boards"),
    ("ablate_deeppcb_plain_tiny_30min_synthetic_boards-400_seed-1", "400 boards"),
    ("scaling_deeppcb_plain_tiny_60min", "none"),
    ("ablate_deeppcb_plain_tiny_60min_synthetic_boards-400", "400 boards"),
)
BOARDS_PAIRS = tuple(  # one core, 20 minutes, seeds 0-3: (without, with 400 boards)
    (PLAIN_20 + f"synthetic_boards-0{suffix}", PLAIN_20 + f"synthetic_boards-400{suffix}")
    for suffix in ("", "_seed-1", "_seed-2", "_seed-3")
)


def section_boards(page: Page) -> None:
    page.heading(2, "DeepPCB without templates: synthetic boards")
    gains = [page.results[w].map50 - page.results[wo].map50 for wo, w in BOARDS_PAIRS]
    pin = [
        page.results[w].class_ap("pin-hole") - page.results[wo].class_ap("pin-hole") for wo, w in BOARDS_PAIRS
    ]
    short = page.results["ablate_deeppcb_plain_tiny_10min_synthetic_boards-400"]
    short_control = page.results["ablate_deeppcb_plain_tiny_10min_synthetic_boards-0"]
    page.prose(
        "train-synthetic-boards-n-mixes",
        statistics_mean_gains=f"{statistics.mean(gains):+.3f}",
        min_pin=f"{min(pin):+.2f}",
        max_pin=f"{max(pin):+.2f}",
        f3_short_map50=f3(short.map50),
        f3_short_control_map50=f3(short_control.map50),
    )
    rows = []
    for name, what in BOARDS_RUNS:
        result = page.r(name)
        rows.append(
            [
                what,
                f"{result.minutes:g}",
                f"seed {result.seed()}",
                result.cpu,
                result.threads,
                count(result.steps),
                f3(result.map50),
                f3(result.class_ap("pin-hole")),
                f3(result.class_ap("spur")),
                page.cite(name),
            ]
        )
    headers = (
        "synthetic boards",
        "minutes",
        "seed",
        "machine",
        "threads",
        "steps",
        "mAP@0.5",
        "pin-hole",
        "spur",
    )
    page.table((*headers, "file"), rows)


NEW_DESIGN = (
    ("new_design_control_10min", "new_design_clean_10min"),
    ("new_design_control_20min", "new_design_clean_20min"),
    ("new_design_tiny_control_20min", "new_design_tiny_clean_20min"),
    ("new_design_tiny_control_20min_threads-2", "new_design_tiny_clean_20min_threads-2"),
)


def section_new_design(page: Page) -> None:
    page.heading(2, "DeepPCB without templates: a few defect-free images of the new design")
    control, clean = (page.results[name] for name in NEW_DESIGN[-1])
    page.prose(
        "what-closes-the-design-gap",
        f3_control_map50=f3(control.map50),
        f3_clean_map50=f3(clean.map50),
        f3_control_class_ap_pin_hole=f3(control.class_ap("pin-hole")),
        f3_clean_class_ap_pin_hole=f3(clean.class_ap("pin-hole")),
        page_cite_new_design=page.cite("new_design"),
        page_cite_new_design_tiny=page.cite("new_design_tiny"),
        page_cite_new_design_tiny_threads_2=page.cite("new_design_tiny_threads-2"),
    )
    rows = []
    for pair in NEW_DESIGN:
        for name, what in zip(pair, ("none", "40 defect-free images"), strict=True):
            result = page.r(name)
            rows.append(
                [
                    what,
                    result.preset,
                    f"{result.minutes:g}",
                    result.cpu,
                    result.threads,
                    count(result.steps),
                    f3(result.map50),
                    f3(result.class_ap("pin-hole")),
                    f3(result.class_ap("spur")),
                    page.cite(name),
                ]
            )
    headers = (
        "clean images of the new design",
        "preset",
        "minutes",
        "machine",
        "threads",
        "steps",
        "mAP@0.5",
    )
    page.table((*headers, "pin-hole", "spur", "file"), rows)


DESIGN_BOUND = (
    "template_oracle_ablate_deeppcb_plain_tiny_20min_synthetic_boards-0_threads-2",
    "template_oracle_ablate_deeppcb_plain_tiny_20min_synthetic_boards-400_threads-2",
    "template_oracle_ablate_deeppcb_plain_tiny_60min_synthetic_boards-400",
)


CLEAN_TEMPLATES = (
    "ablate_deeppcb_plain_nano_10min_clean_templates-True",
    "ablate_deeppcb_plain_nano_10min_clean_templates-False",
)
IMGSZ_RUNS = (PLAIN_20 + "imgsz-800", PLAIN_20 + "synthetic_boards-400_imgsz-512")


def section_design_bound(page: Page) -> None:
    page.heading(3, "How much of the gap is the new design")
    probe = page.r("template_probe_deeppcb_plain_nano_10min")
    calls = {
        group: (v.get("false_calls") or {}).get("pin-hole", 0) for group, v in probe.doc["groups"].items()
    }
    page.prose(
        "on-20-defect-free-templates",
        calls_get_92000_0=calls.get("92000", 0),
        most_calls_in_a_group=max(
            (v for g, v in calls.items() if probe.doc["groups"][g]["split"] == "train")
        ),
        page_cite_probe_name=page.cite(probe.name),
    )
    rows = []
    for name in DESIGN_BOUND:
        result = page.r(name)
        source = page.results.get(name.removeprefix("template_oracle_"))
        rows.append(
            [
                f"{source.preset}, {source.minutes:g} min" if source else name,
                f"{source.cpu}, {threads_text(source.threads)}" if source else "-",
                f3(result.doc["as_is"]["mAP50"]),
                f3(result.doc["template_oracle"]["mAP50"]),
                f"{f3(result.doc['as_is']['class_AP50']['pin-hole'])} → "
                f"{f3(result.doc['template_oracle']['class_AP50']['pin-hole'])}",
                page.cite(name),
            ]
        )
    page.table(
        ("run", "machine", "mAP@0.5 as it answers", "unchanged design removed", "pin-hole", "file"), rows
    )
    with_t, without_t = page.r(CLEAN_TEMPLATES[0]), page.r(CLEAN_TEMPLATES[1])
    big, small = page.r(IMGSZ_RUNS[0]), page.r(IMGSZ_RUNS[1])
    page.prose(
        "two-things-that-do-not",
        f3_with_t_map50=f3(with_t.map50),
        f3_without_t_map50=f3(without_t.map50),
        f3_with_t_class_ap_pin_hole=f3(with_t.class_ap("pin-hole")),
        page_cite_with_t_name=page.cite(with_t.name),
        page_cite_without_t_name=page.cite(without_t.name),
        f3_big_map50=f3(big.map50),
        page_cite_big_name=page.cite(big.name),
        f3_small_map50=f3(small.map50),
        page_cite_small_name=page.cite(small.name),
    )


SURFACE_SEEDS = {
    "nano": ["scaling_surface_nano_10min"] + [f"ablate_surface_nano_10min_seed-{s}" for s in range(1, 5)],
    "tiny": ["pretrained_surface_tiny_pretrained_10min"]
    + [f"ablate_surface_tiny_10min_seed-{s}" for s in range(1, 6)]
    + ["ablate_surface_tiny_10min_seed-5_stop39"],
}
SURFACE_CLASSES = ("scratch", "crack", "pin-hole")


def section_surfaces(page: Page) -> None:
    page.heading(2, "Synthetic surfaces")
    tiny = [page.results[name] for name in SURFACE_SEEDS["tiny"]]
    nano = [page.results[name] for name in SURFACE_SEEDS["nano"]]
    page.prose(
        "the-surface-family-defectdet-synth",
        tiny_spread=spread([r.map50 for r in tiny]),
        nano_spread=spread([r.map50 for r in nano]),
    )
    rows = []
    for preset, names in SURFACE_SEEDS.items():
        for name in names:
            result = page.r(name)
            aps = ", ".join(f"{c} {f3(result.class_ap(c))}" for c in SURFACE_CLASSES)
            rows.append(
                [
                    preset,
                    f"seed {result.seed()}",
                    result.cpu,
                    result.threads,
                    count(result.steps),
                    f3(result.map50),
                    aps,
                    page.cite(name),
                ]
            )
    page.table(
        ("preset", "seed", "machine", "threads", "steps", "mAP@0.5", "hardest classes (AP50)", "file"), rows
    )
    whole = page.r("train_surface_10min")
    tiles = page.r("tiles")
    boards = page.r("ablate_surface_tiny_10min_synthetic_boards-200")
    page.prose(
        "on-the-whole-2-core",
        f3_whole_map50=f3(whole.map50),
        count_whole_steps=count(whole.steps),
        page_cite_whole_name=page.cite(whole.name),
        f3_tiles_doc_held_out_tiles_off_map50=f3(tiles.doc["held_out"]["tiles_off"]["mAP50"]),
        f3_tiles_doc_held_out_tiles_on_map50=f3(tiles.doc["held_out"]["tiles_on"]["mAP50"]),
        page_cite_tiles_name=page.cite(tiles.name),
        f3_boards_map50=f3(boards.map50),
        page_cite_boards_name=page.cite(boards.name),
    )
    modes = page.r("preset_modes_5min").doc["modes"]
    rows = []
    for mode, arms in modes.items():
        for preset in ("nano", "tiny"):
            arm = arms[preset]
            stem = arm["file"].removesuffix(".json")
            result = page.r(stem)
            rows.append(
                [
                    mode,
                    preset,
                    arm["imgsz"],
                    result.cpu,
                    result.threads,
                    count(arm["steps"]),
                    f3(arm["mAP50"]),
                    f"{arm['lowest_class']['name']} {f3(arm['lowest_class']['AP50'])}",
                    page.cite(stem),
                ]
            )
    wins = page.results["preset_modes_5min"].doc["tiny_wins"]
    page.prose(
        "four-more-synthetic-modes-300", page_cite_preset_modes_5min=page.cite("preset_modes_5min"), wins=wins
    )
    headers = (
        "mode",
        "preset",
        "input size",
        "machine",
        "threads",
        "steps",
        "mAP@0.5",
        "lowest class",
        "file",
    )
    page.table(headers, rows)


LADDER = (  # (dataset label, preset, starting weights, files by minutes)
    (
        "DeepPCB without templates",
        "nano",
        "shipped",
        [f"scaling_deeppcb_plain_nano_{m}min" for m in (10, 20, 30, 60)],
    ),
    (
        "DeepPCB without templates",
        "tiny",
        "shipped",
        ["pretrained_deeppcb_plain_tiny_pretrained_10min"]
        + [f"scaling_deeppcb_plain_tiny_{m}min" for m in (20, 30, 60)],
    ),
    (
        "DeepPCB without templates, 400 synthetic boards",
        "tiny",
        "shipped",
        [PLAIN_20 + "synthetic_boards-400"]
        + [f"ablate_deeppcb_plain_tiny_{m}min_synthetic_boards-400" for m in (30, 60)],
    ),
    ("DeepPCB with templates", "nano", "random", [f"scaling_deeppcb_template_nano_{m}min" for m in (10, 60)]),
    ("surfaces", "nano", "shipped", [f"scaling_surface_nano_{m}min" for m in (10, 30, 60)]),
    (
        "surfaces",
        "tiny",
        "shipped",
        ["pretrained_surface_tiny_pretrained_10min"] + [f"scaling_surface_tiny_{m}min" for m in (30, 60)],
    ),
    ("surfaces", "base", "random", ["scaling_surface_base_30min"]),
)


def section_ladder(page: Page, plots: list[Callable[[], None]]) -> None:
    page.heading(2, "Accuracy against minutes of training")
    surf = [page.results[n].map50 for n in LADDER[5][3]]
    plain = [page.results[n].map50 for n in LADDER[1][3]]
    base = page.results["scaling_surface_base_30min"]
    page.para(
        "Each budget is its own run with its own learning-rate schedule, one core each (1 torch thread), defaults",
        "otherwise, scored from the final weights on the held-out images. tiny on the surfaces goes",
        " → ".join(f3(v) for v in surf) + " at 10, 30 and 60 minutes; on DeepPCB without templates",
        " → ".join(f3(v) for v in plain) + " at 10, 20, 30 and 60 minutes, flat after 30 (with 400 synthetic",
        f"boards: {' → '.join(f3(page.results[n].map50) for n in LADDER[2][3])} at 20, 30 and 60). tiny beats nano",
        "at every budget. The larger `base` preset, from random weights,",
        f"reaches only {f3(base.map50)} in 30 minutes: on a CPU budget of an hour or less it gets too few steps.",
        f"Summary with every curve: {page.cite('scaling')}.",
    )
    rows = []
    for data, preset, start, names in LADDER:
        for name in names:
            result = page.r(name)
            rows.append(
                [
                    data,
                    preset,
                    start,
                    f"{result.minutes:g}",
                    result.cpu,
                    result.threads,
                    count(result.steps),
                    f3(result.map50),
                    f3(result.final.get("mAP50_95")),
                    page.cite(name),
                ]
            )
    headers = ("data", "preset", "starting weights", "minutes", "machine", "threads", "steps", "mAP@0.5")
    page.table((*headers, "mAP@0.5:0.95", "file"), rows)
    page.prose("the-plot-of-these-rows")


def plot_ladder(results: dict[str, Result]) -> None:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    for data, preset, start, names in LADDER:
        axis = axes[0] if data.startswith("DeepPCB") else axes[1]
        points = sorted((results[n].minutes, results[n].map50) for n in names)
        label = f"{preset}, {data.removeprefix('DeepPCB ')}" if data.startswith("DeepPCB") else preset
        if start == "random":
            label += " (random start)"
        axis.plot(*zip(*points, strict=True), marker="o", label=label)
    for axis, title in zip(axes, ("DeepPCB, held-out board groups", "synthetic surfaces"), strict=True):
        axis.set_title(title)
        axis.set_xlabel("minutes of training (one core)")
        axis.set_ylabel("held-out mAP@0.5")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    save_figure(figure, "minutes.png")


WEIGHT_PAIRS = (  # (data, preset, scratch file, shipped-weights file)
    (
        "DeepPCB without templates",
        "nano",
        "pretrained_deeppcb_plain_scratch_10min",
        "scaling_deeppcb_plain_nano_10min",
    ),
    ("surfaces", "nano", "pretrained_surface_scratch_10min", "scaling_surface_nano_10min"),
    (
        "DeepPCB without templates",
        "tiny",
        "pretrained_deeppcb_plain_tiny_scratch_10min",
        "pretrained_deeppcb_plain_tiny_pretrained_10min",
    ),
    ("surfaces", "tiny", "pretrained_surface_tiny_scratch_10min", "pretrained_surface_tiny_pretrained_10min"),
)
PRETRAIN = (
    ("pretrain_nano_plain", "nano, tested image alone (ships)"),
    ("pretrain_tiny_plain", "tiny, tested image alone (ships)"),
    ("pretrain_nano_template", "nano, image and template (does not ship)"),
    ("pretrain_candidate_epochs48", "nano candidate: 48 epochs on half the images"),
    ("pretrain_candidate_surfaces2400", "nano candidate: twice the surfaces"),
)
CANDIDATE_RUNS = (
    ("pretrain_candidate_epochs48_surface_10min", "48-epoch candidate"),
    ("pretrain_candidate_surfaces2400_surface_10min", "twice-the-surfaces candidate"),
    *(
        (f"pretrain_candidate_surfaces2400_surface_10min_seed-{s}", "twice-the-surfaces candidate")
        for s in range(1, 5)
    ),
    ("pretrain_candidate_surfaces2400_deeppcb_plain_10min", "twice-the-surfaces candidate"),
)


def section_weights(page: Page, plots: list[Callable[[], None]]) -> None:
    page.heading(2, "Shipped starting weights against random weights")
    surf_scratch, surf_shipped = (page.results[n] for n in WEIGHT_PAIRS[3][2:])
    page.prose(
        "nano-and-tiny-start-from",
        f3_surf_scratch_map50=f3(surf_scratch.map50),
        f3_surf_shipped_map50=f3(surf_shipped.map50),
        page_cite_pretrained_10min=page.cite("pretrained_10min"),
        page_cite_pretrained_tiny_10min=page.cite("pretrained_tiny_10min"),
    )
    rows = []
    for data, preset, scratch, shipped in WEIGHT_PAIRS:
        a, b = page.r(scratch), page.r(shipped)
        rows.append(
            [
                data,
                preset,
                f"{b.minutes or a.minutes or 10:g}",
                b.cpu,
                b.threads,
                f3(a.map50),
                f3(b.map50),
                f"{b.map50 - a.map50:+.3f}",
                f"{page.cite(scratch)}, {page.cite(shipped)}",
            ]
        )
    headers = ("data", "preset", "minutes", "machine", "threads", "random start", "shipped weights", "gain")
    page.table((*headers, "files"), rows)
    page.image("weights.png", "held-out mAP@0.5 from random and from shipped starting weights")
    plots.append(lambda: plot_weights(page.results))
    page.prose("make-pretrain-bench-pretrain-py")
    rows = []
    for name, what in PRETRAIN:
        result = page.r(name)
        final = result.final
        rows.append(
            [
                what,
                count(final.get("train_images")),
                f"{final.get('epochs')} ({count(final.get('steps'))})",
                f2(final.get("train_minutes")),
                result.cpu,
                f3(final.get("synthetic_val_mAP50")),
                page.cite(name),
            ]
        )
    headers = ("weights", "training images", "epochs (steps)", "minutes", "machine", "synthetic val mAP@0.5")
    page.table((*headers, "file"), rows)
    rows = []
    for name, what in CANDIDATE_RUNS:
        result = page.r(name)
        rows.append(
            [
                what,
                result.doc.get("dataset", "-"),
                f"seed {result.seed()}",
                result.cpu,
                result.threads,
                f3(result.map50),
                f3(result.class_ap("scratch")),
                page.cite(name),
            ]
        )
    page.prose("the-candidates-measured-like-the")
    page.table(("candidate", "data", "seed", "machine", "threads", "mAP@0.5", "scratch", "file"), rows)


def plot_weights(results: dict[str, Result]) -> None:
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.5))
    labels = [f"{data}\n{preset}" for data, preset, _, _ in WEIGHT_PAIRS]
    x = range(len(WEIGHT_PAIRS))
    scratch = [results[s].map50 for _, _, s, _ in WEIGHT_PAIRS]
    shipped = [results[p].map50 for _, _, _, p in WEIGHT_PAIRS]
    axis.bar([i - 0.2 for i in x], scratch, width=0.4, label="random start")
    axis.bar([i + 0.2 for i in x], shipped, width=0.4, label="shipped weights")
    axis.set_xticks(list(x), labels, fontsize=8)
    axis.set_ylabel("held-out mAP@0.5, 10 minutes")
    axis.set_ylim(0, 1)
    axis.legend(fontsize=8)
    axis.grid(axis="y", alpha=0.3)
    save_figure(figure, "weights.png")


def section_transfer(page: Page) -> None:
    page.heading(2, "Trained on synthetic boards only")
    demo, transfer = page.r("demo"), page.r("synth_to_deeppcb")
    page.prose(
        "make-demo-draws-160-synthetic",
        f3_demo_doc_held_out_map50=f3(demo.doc["held_out"]["mAP50"]),
        f2_demo_doc_wall_minutes_all_steps=f2(demo.doc["wall_minutes_all_steps"]),
        demo_machine=demo.machine,
        page_cite_demo_name=page.cite(demo.name),
        f3_transfer_doc_by_name_map50=f3(transfer.doc["by_name"]["mAP50"]),
        f3_transfer_doc_class_agnostic_map50=f3(transfer.doc["class_agnostic"]["mAP50"]),
        page_cite_transfer_name=page.cite(transfer.name),
    )


CLEAN_BOARDS = ("clean_boards_deeppcb", "clean_boards_deeppcb_ft_control", "clean_boards_deeppcb_ft_jitter")


def section_clean_boards(page: Page) -> None:
    page.prose("a-line-signs-off-on")
    rows = []
    for name in CLEAN_BOARDS:
        result = page.r(name)
        for row in result.doc["rows"]:
            if row["condition"].startswith("nuisances, default") or row["condition"].startswith(
                "template as"
            ):
                continue
            rows.append(
                [
                    name.removeprefix("clean_boards_deeppcb").strip("_").replace("ft_", "fine-tuned, ")
                    or "nano, 15 min",
                    row["condition"].replace(" deg", "°"),
                    "on" if row["registration"] else "off",
                    f"{row['false_calls']} of {row['clean_boards']}",
                    f"{row['escapes']} of {row['defective_boards']}",
                    f3(row["clean_max_score"]["max"]),
                    result.cpu,
                    page.cite(name),
                ]
            )
    headers = ("model", "clean recapture", "registration", "false calls", "escapes", "highest clean score")
    page.table((*headers, "machine", "file"), rows)
    control, jitter = page.r("pair_jitter_finetune_control"), page.r("pair_jitter_finetune_jitter")
    synth = page.r("clean_boards_synth")
    page.prose(
        "the-fine-tuned-models-are",
        page_cite_control_name=page.cite(control.name),
        page_cite_jitter_name=page.cite(jitter.name),
        page_cite_synth_name=page.cite(synth.name),
    )


def conclusion_accuracy(page: Page, plots: list[Callable[[], None]]) -> None:
    """What a user should take from the page, with the plot of accuracy against minutes of training."""
    nano = page.r("train_deeppcb_nano_20min")
    current = [page.r(name) for name in CURRENT_DEFAULT_RUNS]
    surf = [page.r(n).map50 for n in LADDER[5][3]]
    page.prose(
        "what-to-conclude-with-a",
        f3_nano_map50=f3(nano.map50),
        minutes_of_nano_doc_time_to_time_to_map5=minutes_of(nano.doc["time_to"]["time_to_mAP50_0.95_s"]),
        current_mean=f3(statistics.mean(r.map50 for r in current)),
        len_current=len(current),
        surface_steps=" → ".join(f3(v) for v in surf),
    )
    page.image("minutes.png", "held-out mAP@0.5 against minutes of training")
    plots.append(lambda: plot_ladder(page.results))


def page_accuracy(results: dict[str, Result], plots: list[Callable[[], None]]) -> Page:
    page = Page("accuracy", "Accuracy", results)
    conclusion_accuracy(page, plots)
    page.prose("held-out-map-0-5")
    section_templates(page)
    section_plain_recipe(page, plots)
    section_boards(page)
    section_new_design(page)
    section_design_bound(page)
    section_surfaces(page)
    section_ladder(page, plots)
    section_weights(page, plots)
    section_transfer(page)
    section_clean_boards(page)
    return page
