"""The real-data benchmark page (docs/benchmarks/real-data.md) from the `realdata_*` files of bench/results/.

`page_real_data(results, plots)` builds the page for `bench/pages.py`; `real_data_markdown(results)` returns its
markdown. Files made from uncommitted code are left off (the manifest lists them). Runs with changed settings
(`--set`, recorded as `overrides`) and the ways of giving AGDD's second lighting as a second plane are
experiments: they are listed under "What was tried", apart from the defaults' figures.
"""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.benchpages.core import IMG, Page, Result, f1, f2, f3, pct, save_figure, threads_text
from bench.common import RESULTS_DIR

LABELS = {
    "agdd_1light": "AGDD, one lighting",
    "agdd_2light": "AGDD, both lightings as separate images",
    "agdd_pair": "AGDD, second lighting as the template plane",
    "agdd_companion": "AGDD, second lighting as a companion capture",
    "deeppcb_plain": "DeepPCB without templates",
    "deeppcb_template": "DeepPCB with templates",
}
# What the datasets' authors published, quoted with its source: a different setting from ours (a GPU, their own
# split and training schedule, their metric), so a frame of reference, not a like-for-like comparison.
PUBLISHED: dict[str, str] = {
    "agdd": (
        "the dataset's authors report mAP 98.4 % for their two-lighting fusion network, 5.6 points above their "
        "one-lighting baseline, trained on a GPU ([Sensors 24(20), 6717, 2024](https://doi.org/10.3390/s24206717))"
    ),
    "deeppcb": (
        "the dataset's authors report mAP 98.6 % at 62 images/s on a GPU with the template pair, on their own "
        "1,000/500 split ([Tang et al., 2019](https://arxiv.org/abs/1902.06197))"
    ),
}


# a dataset measured on the same val images as another: its runs are compared with that one's defaults
COMPARED_WITH = {"agdd_pair": "agdd_1light", "agdd_companion": "agdd_1light"}


def is_experiment(result: Result) -> bool:
    """Settings changed from the defaults (`bench/realdata.py --set`)."""
    return bool(result.doc.get("overrides"))


def realdata_results(results: dict[str, Result], experiments: bool = False) -> list[Result]:
    """The committed runs with the defaults (or, `experiments`, with changed settings), by dataset, minutes,
    seed."""
    found = [r for name, r in results.items() if name.startswith("realdata_") and "dataset" in r.doc]
    found = [r for r in found if not r.dirty and is_experiment(r) == experiments]
    order = list(LABELS)
    return sorted(
        found,
        key=lambda r: (
            order.index(r.doc["dataset"]) if r.doc["dataset"] in order else 99,
            r.minutes or 0,
            r.seed(),
        ),
    )


def without_rare(doc: dict[str, Any]) -> float | None:
    """AGDD's mAP@0.5 over its classes but crack: its val split holds one crack box with one lighting, whose
    AP (0 to 1 on one box) swings the 4-class mean by up to a quarter."""
    if not str(doc.get("dataset", "")).startswith("agdd"):
        return None
    values = [v for name, v in (doc.get("per_class_AP50") or {}).items() if name != "crack" and v is not None]
    return statistics.fmean(values) if values else None


def _mean_without_rare(runs: list[Result]) -> float | None:
    values = [v for v in (without_rare(r.doc) for r in runs) if v is not None]
    return statistics.fmean(values) if values else None


def _mean(runs: list[Result]) -> float | None:
    values = [r.doc["mAP50"] for r in runs if r.doc.get("mAP50") is not None]
    return statistics.fmean(values) if values else None


def _measured(runs: list[Result]) -> str:
    mean = _mean(runs)
    if mean is None:
        return "not measured yet"
    values = [r.doc["mAP50"] for r in runs]
    rare = _mean_without_rare(runs)
    without = "" if rare is None else f"; {f3(rare)} without crack"
    if len(values) == 1:
        return f"{f3(mean)} (one run{without})"
    return f"{f3(mean)} (range {f3(min(values))}-{f3(max(values))}, {len(values)} runs{without})"


def _expectations(page: Page, runs: list[Result]) -> None:
    """What the defaults reach on each dataset at 10 and 60 minutes on a CPU, beside what was published."""
    rows = []
    for dataset, label in LABELS.items():
        ten = [r for r in runs if r.doc["dataset"] == dataset and r.minutes == 10]
        sixty = [r for r in runs if r.doc["dataset"] == dataset and r.minutes == 60]
        if not ten and not sixty:
            continue
        rows.append([label, _measured(ten), _measured(sixty)])
    page.table(("data", "mAP@0.5, 10 min on a CPU", "mAP@0.5, 60 min on a CPU"), rows)
    page.prose(
        "published-results-on-these-datasets",
        published_agdd=PUBLISHED["agdd"],
        published_deeppcb=PUBLISHED["deeppcb"],
    )


def _boards(result: Result) -> tuple[str, str]:
    boards = result.doc.get("boards") or {}
    escapes = boards.get("escapes")
    defective = boards.get("defective_boards")
    escape_text = "-" if escapes is None else f"{escapes} of {defective}"
    clean = boards.get("clean_boards") or 0
    false_text = f"{boards.get('false_calls')} of {clean}" if clean else "no defect-free images"
    return escape_text, false_text


def _run_rows(page: Page, runs: list[Result]) -> list[list[Any]]:
    rows = []
    for result in runs:
        doc = result.doc
        escapes, false_calls = _boards(result)
        threshold = doc.get("threshold") or {}
        rows.append(
            [
                LABELS.get(doc["dataset"], doc["dataset"]),
                f"{result.minutes:g}",
                result.seed(),
                f"{result.cpu}, {threads_text(result.threads)}",
                _probe(doc["speed_probe"]),
                f"{doc.get('steps') or 0:,}",
                f3(doc.get("mAP50")),
                f3(without_rare(doc)),
                f3(doc.get("mAP50_95")),
                _merged_text(doc),
                f3(doc.get("internal_held_out_mAP50")),
                f3(threshold.get("value")),
                escapes,
                false_calls,
                page.cite(result.name),
            ]
        )
    return rows


def _merged_text(doc: dict[str, Any]) -> str:
    """Which classes the bundle merged fragments of, and the mAP@0.5 without it; '-' for a run scored before
    the fragment merge existed."""
    merge = doc.get("fragment_merge")
    if merge is None:
        return "-"
    if not merge["classes"]:
        return "no class"
    return f"{', '.join(merge['classes'])} (without: {f3(merge['without']['mAP50'])})"


def _fragment_rows(page: Page, runs: list[Result]) -> list[list[Any]]:
    """Per run scored with the fragment merge: what export measured on its threshold split, and what the
    report split gives with and without the merge."""
    rows = []
    for result in runs:
        merge = result.doc.get("fragment_merge")
        if merge is None:
            continue
        evidence = ", ".join(
            f"{name} {f3(e['as_is'])} -> {f3(e['merged'])} ({e['boxes']} boxes)"
            for name, e in (merge.get("evidence") or {}).items()
        )
        without = (merge.get("without") or {}).get("mAP50")
        rows.append(
            [
                LABELS.get(result.doc["dataset"], result.doc["dataset"]),
                _changed(result) if is_experiment(result) else "defaults",
                f"{result.minutes:g}",
                result.seed(),
                evidence or "no class with 10 boxes",
                ", ".join(merge["classes"]) or "none",
                f"{f3(without)} -> {f3(result.doc.get('mAP50'))}"
                if without is not None
                else f3(result.doc.get("mAP50")),
                page.cite(result.name),
            ]
        )
    return rows


def _fragments(page: Page, runs: list[Result]) -> None:
    rows = _fragment_rows(page, runs)
    if not rows:
        return
    page.prose("a-long-or-large-defect")
    changes = [
        r.doc["mAP50"] - r.doc["fragment_merge"]["without"]["mAP50"]
        for r in runs
        if (r.doc.get("fragment_merge") or {}).get("without") and r.doc.get("mAP50") is not None
    ]
    if changes:
        page.prose(
            "over-the-len-changes-runs",
            len_changes=len(changes),
            min_changes=f"{min(changes):+.3f}",
            max_changes=f"{max(changes):+.3f}",
            statistics_fmean_changes=f"{statistics.fmean(changes):+.3f}",
        )
    page.table(
        (
            "data",
            "settings",
            "minutes",
            "seed",
            "AP@0.5 on the threshold split, as is -> merged",
            "merged",
            "mAP@0.5 reported, without -> with the merge",
            "file",
        ),
        rows,
    )


def _probe(probe: dict[str, Any]) -> str:
    after = probe.get("ms_per_step_after")
    return f1(probe["ms_per_step"]) + ("" if after is None else f" / {f1(after)} after")


def _class_rows(page: Page, runs: list[Result]) -> list[list[Any]]:
    rows = []
    for result in runs:
        classes = result.doc.get("per_class_AP50") or {}
        text = ", ".join(f"{name} {f3(value)}" for name, value in classes.items())
        rows.append(
            [
                LABELS.get(result.doc["dataset"], result.doc["dataset"]),
                f"{result.minutes:g}",
                result.seed(),
                text,
            ]
        )
    return rows


def _protocol(page: Page) -> None:
    page.prose("each-run-is-defectdet-train")
    page.table(
        ("data", "trained on", "threshold chosen on", "reported on"),
        [
            [
                "AGDD (aircraft glass: thin scratches, faint spots, two aligned lightings per sample)",
                "`train.json` alone: the trainer holds out whole groups of it (both lightings of a sample "
                "together)",
                "that held-out part",
                "AGDD `val.json`: other capture sessions",
            ],
            [
                "DeepPCB (printed circuit boards, a golden template per board)",
                "its train board groups",
                "the held-out board groups",
                "the same held-out board groups (optimistic for escapes and false calls); defect-free boards "
                "are the templates recaptured with small nuisances",
            ],
        ],
    )
    page.prose("agdd-is-licensed-cc-by")


def _conclusion(page: Page, runs: list[Result], plots: list[Callable[[], None]]) -> None:
    """What a user should take from the page, with the plot of each dataset's figure at 10 and 60 minutes."""

    def mean_of(dataset: str, minutes: float) -> str:
        return f3(_mean([r for r in runs if r.doc["dataset"] == dataset and r.minutes == minutes]))

    page.prose(
        "what-to-conclude-on-real",
        mean_of_deeppcb_template_10=mean_of("deeppcb_template", 10),
        mean_of_agdd_1light_10=mean_of("agdd_1light", 10),
        mean_of_agdd_companion_10=mean_of("agdd_companion", 10),
        mean_of_agdd_companion_60=mean_of("agdd_companion", 60),
    )
    page.image("real-data.png", "held-out mAP@0.5 of the defaults at 10 and 60 minutes, per dataset")
    plots.append(lambda: _plot(runs))


def _plot(runs: list[Result]) -> None:
    import matplotlib.pyplot as plt

    labels = [label for dataset, label in LABELS.items() if any(r.doc["dataset"] == dataset for r in runs)]
    datasets = [dataset for dataset, label in LABELS.items() if label in labels]
    figure, axis = plt.subplots(figsize=(8, 4))
    width = 0.38
    for offset, minutes in ((-width / 2, 10), (width / 2, 60)):
        values = [
            _mean([r for r in runs if r.doc["dataset"] == d and r.minutes == minutes]) for d in datasets
        ]
        positions = [i + offset for i, v in enumerate(values) if v is not None]
        axis.barh(positions, [v for v in values if v is not None], height=width, label=f"{minutes} minutes")
    axis.set_yticks(range(len(labels)), labels, fontsize=8)
    axis.invert_yaxis()
    axis.set_xlim(0, 1)
    axis.set_xlabel("held-out mAP@0.5 (mean of the defaults' runs), 2-core CPU")
    axis.grid(axis="x", alpha=0.3)
    axis.legend(fontsize=8)
    save_figure(figure, "real-data.png")


def page_real_data(results: dict[str, Result], plots: list[Callable[[], None]]) -> Page:
    page = Page("real-data", "Real data", results)
    runs = realdata_results(results)
    _conclusion(page, runs, plots)
    page.prose("the-product-s-defaults-on")
    _expectations(page, runs)
    page.heading(2, "How it is measured")
    _protocol(page)
    page.heading(2, "Runs")
    if not runs:
        page.prose("no-run-recorded-yet")
        return page
    page.table(
        (
            "data",
            "minutes",
            "seed",
            "machine",
            "speed probe, ms/step (before / after training)",
            "steps",
            "mAP@0.5",
            "mAP@0.5 without crack (AGDD)",
            "mAP@0.5:0.95",
            "fragment merge",
            "the trainer's own held-out mAP@0.5",
            "threshold",
            "escapes",
            "false calls",
            "file",
        ),
        _run_rows(page, runs),
    )
    page.para(
        "Escapes are defective images with no detection at or above the threshold; false calls are defect-free",
        "images with one. The trainer's own held-out figure is what `train` printed for its validation split;",
        "where it is well above mAP@0.5 the held-out part flatters. AGDD's val split holds one crack box with",
        "one lighting (two with both): its crack AP (0 to 1 on that one box) moves the mean over four classes by",
        "up to a quarter, so AGDD's runs are also given without crack.",
        *_board_sentences(runs),
        *_minutes_sentences(runs),
        *_step_sentences(runs),
    )
    page.heading(2, "Per class (AP@0.5)")
    page.table(("data", "minutes", "seed", "AP@0.5 per class"), _class_rows(page, runs))
    page.para(
        "AGDD's val split holds two crack boxes (one with one lighting): its crack AP is not a measurement.",
        *_weakest(runs),
    )
    experiments = realdata_results(results, experiments=True)
    _presets(page, runs, [r for r in experiments if is_preset_run(r)])
    _frozen_features(page, runs, results)
    experiments = [r for r in experiments if not is_preset_run(r)]
    _fragments(page, runs + experiments)
    _tried(page, runs, [r for r in experiments if not is_step_matched(r)])
    _step_matched(page, [r for r in experiments if is_step_matched(r)])
    _distilled(page, results.get("distill_tiny"), [r for r in experiments if is_step_matched(r)])
    _diagnosis(page, results.get("agdd_diagnosis"))
    _false_calls(page, results)
    _good_only(page, results)
    return page


GOOD_ONLY_DATA = {"deeppcb": "DeepPCB", "agdd": "AGDD (L1 tiles)", "surface": "synthetic surfaces"}
PATCHCORE_ROW = "MVTec AD, other data: PatchCore as published (Roth et al., 2022)"


def _good_only_order(result: Result) -> tuple[int, float]:
    key = result.doc.get("dataset_key", "deeppcb")
    return (
        list(GOOD_ONLY_DATA).index(key) if key in GOOD_ONLY_DATA else len(GOOD_ONLY_DATA),
        result.minutes or 0,
    )


def _good_only(page: Page, results: dict[str, Result]) -> None:
    """`bench/good_only.py`: models fitted on defect-free images alone, one row per dataset and budget, and
    published PatchCore on MVTec AD as context."""
    runs = [r for name, r in sorted(results.items()) if name.startswith("good_only_") and not r.dirty]
    if not runs:
        return
    page.prose("defectdet-fit-on-the-defect")
    rows = []
    for result in sorted(runs, key=_good_only_order):
        doc = result.doc
        fit = doc.get("fit") or {}
        ap = doc.get("box_AP50_class_agnostic") or {}
        floor_ap = next((value for key, value in ap.items() if key.startswith("score_floor")), None)
        evaluated = doc.get("evaluated_on") or {}
        rows.append(
            [
                GOOD_ONLY_DATA.get(doc.get("dataset_key", "deeppcb"), doc.get("dataset_key")),
                f1(doc.get("minutes")),
                result.machine,
                f"{fit.get('fit_images')} of {fit.get('images_available')} (+{fit.get('heldout_images')} held out)",
                f"{_count(evaluated.get('defective'))} / {_count(evaluated.get('good'))}",
                fit.get("input_size"),
                f3(doc.get("image_auroc")),
                f3(doc.get("false_call_rate")),
                f3(doc.get("escape_rate")),
                f3(floor_ap),
                f1((doc.get("model_ms") or {}).get("p50")),
                f1(((doc.get("environment") or {}).get("machine") or {}).get("load_average", [None])[0]),
                page.cite(result.name),
            ]
        )
    rows.append([PATCHCORE_ROW, "-", "a GPU", "-", "-", "-", "0.99", "-", "-", "-", "-", "-", "-"])
    page.table(
        (
            "data",
            "minutes",
            "machine",
            "good images fitted",
            "scored (defective / good)",
            "input px",
            "image AUROC",
            "false calls (held-out good)",
            "escapes",
            "box AP@0.5",
            "model ms (p50)",
            "load",
            "file",
        ),
        rows,
    )


def _count(text: str | None) -> str:
    """The leading count of an `evaluated_on` entry ("211 tested images ..." -> "211")."""
    return (text or "-").split(" ", 1)[0]


def _changed(result: Result) -> str:
    """What a tried run changed: its settings, or the way the second lighting is given."""
    overrides = _flat(result.doc.get("overrides") or {})
    changed = ", ".join(f"`{key}={value}`" for key, value in overrides.items())
    if result.doc["dataset"] in COMPARED_WITH and not changed:
        return LABELS[result.doc["dataset"]]
    return changed or "-"


def _model(result: Result) -> str:
    """The preset, starting weights and input size the run trained with (chosen or set)."""
    settings = result.doc.get("settings") or {}
    if not settings:
        return "-"
    weights = "shipped starting weights" if settings.get("pretrained") else "no starting weights"
    if settings.get("pretrained") and settings.get("preset") == "lite0":
        weights = "ImageNet weights"
    return f"{settings.get('preset')}, {weights}, {settings.get('input_size')} px"


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _baseline(result: Result, runs: list[Result]) -> tuple[str, list[Result]]:
    """The dataset a tried run is compared with, and its default runs at the same minutes."""
    dataset = result.doc["dataset"]
    base = dataset if is_experiment(result) else COMPARED_WITH.get(dataset, dataset)
    return base, [r for r in runs if r.doc["dataset"] == base and r.minutes == result.minutes]


def _tried_rows(page: Page, runs: list[Result], tried: list[Result]) -> list[list[Any]]:
    rows = []
    for result in tried:
        base, defaults = _baseline(result, runs)
        mean, value = _mean(defaults), result.doc.get("mAP50")
        delta = "-" if mean is None or value is None else f"{value - mean:+.3f} (defaults {f3(mean)})"
        rare_mean, rare_value = _mean_without_rare(defaults), without_rare(result.doc)
        if rare_mean is not None and rare_value is not None:
            value_text = f"{f3(value)}; {f3(rare_value)} without crack"
            delta += f"; {rare_value - rare_mean:+.3f} without crack (defaults {f3(rare_mean)})"
        else:
            value_text = f3(value)
        classes = result.doc.get("per_class_AP50") or {}
        rows.append(
            [
                LABELS.get(base, base),
                _changed(result),
                _model(result),
                f"{result.minutes:g}",
                result.seed(),
                f"{result.doc.get('steps') or 0:,}",
                value_text,
                delta,
                ", ".join(f"{name} {f3(ap)}" for name, ap in classes.items()),
                page.cite(result.name),
            ]
        )
    return rows


def _tried(page: Page, runs: list[Result], experiments: list[Result]) -> None:
    """Per dataset: what was tried against the defaults, with its measured figure."""
    variants = [r for r in runs if r.doc["dataset"] in COMPARED_WITH]
    tried = sorted(variants + experiments, key=lambda r: (_baseline(r, runs)[0], r.minutes or 0, r.name))
    page.heading(2, "What was tried")
    if not tried:
        page.prose("nothing-but-the-defaults-yet")
        return
    page.prose("runs-that-change-one-thing", f3_seed_spread_runs=f3(_seed_spread(runs)))
    page.table(
        (
            "data",
            "changed",
            "model",
            "minutes",
            "seed",
            "steps",
            "mAP@0.5",
            "against the defaults",
            "AP@0.5 per class",
            "file",
        ),
        _tried_rows(page, runs, tried),
    )
    page.para(*_gap_sentences(runs, tried))


def is_preset_run(result: Result) -> bool:
    """A run that sets the preset and nothing else (`--set preset=P --tag P`): presets compared side by side."""
    return set(result.doc.get("overrides") or {}) == {"preset"}


def _preset_rows(page: Page, runs: list[Result], preset_runs: list[Result]) -> list[list[Any]]:
    rows = []
    for result in preset_runs:
        doc = result.doc
        same_run = [
            other.doc["overrides"]["preset"]
            for other in preset_runs
            if other is not result
            and (other.doc["dataset"], other.minutes, other.seed())
            == (doc["dataset"], result.minutes, result.seed())
        ]
        escapes, false_calls = _boards(result)
        rows.append(
            [
                LABELS.get(doc["dataset"], doc["dataset"]),
                f"{result.minutes:g}",
                result.seed(),
                doc["overrides"]["preset"],
                ", ".join(same_run) or "-",
                f"{doc.get('steps') or 0:,}",
                f3(doc.get("mAP50")),
                f3(without_rare(doc)),
                escapes,
                false_calls,
                ", ".join(f"{name} {f3(ap)}" for name, ap in (doc.get("per_class_AP50") or {}).items()),
                page.cite(result.name),
            ]
        )
    return rows


def _pair_sentences(preset_runs: list[Result]) -> list[str]:
    """Per lite0 run trained beside tiny: the steps each trained and the mAP@0.5 each reached."""
    sentences = []
    for lite in (r for r in preset_runs if r.doc["overrides"]["preset"] == "lite0"):
        key = (lite.doc["dataset"], lite.minutes, lite.seed())
        tiny = [
            r
            for r in preset_runs
            if r.doc["overrides"]["preset"] == "tiny" and (r.doc["dataset"], r.minutes, r.seed()) == key
        ]
        if not tiny or not lite.doc.get("steps"):
            continue
        other = tiny[0].doc
        sentences.append(
            f"{LABELS.get(key[0], key[0])}, {key[1]:g} minutes: tiny trained "
            f"{other['steps'] / lite.doc['steps']:.1f}x lite0's steps and reached {f3(other.get('mAP50'))} "
            f"against lite0's {f3(lite.doc.get('mAP50'))}."
        )
    return sentences


def _presets(page: Page, runs: list[Result], preset_runs: list[Result]) -> None:
    """lite0 (ImageNet features) against the presets of our own backbone, trained side by side."""
    page.heading(2, "ImageNet features (lite0) against tiny")
    if not preset_runs:
        page.prose("no-run-with-a-forced")
        return
    page.para(
        "The same data, budget and seed with the preset forced (`bench/realdata.py --set preset=P --tag P`).",
        "Runs naming another preset in 'trained beside' ran at the same time on the same machine, one thread",
        "each, so they had the same CPU; a run without one is compared with the defaults' runs above, made on",
        "other days.",
        *_pair_sentences(preset_runs),
    )
    page.table(
        (
            "data",
            "minutes",
            "seed",
            "preset",
            "trained beside",
            "steps",
            "mAP@0.5",
            "mAP@0.5 without crack (AGDD)",
            "escapes",
            "false calls",
            "AP@0.5 per class",
            "file",
        ),
        _preset_rows(page, runs, preset_runs),
    )


BESIDE_SECONDS = 20 * 60  # two runs that finished within this of each other trained at the same time


def _finished(result: Result) -> float:
    stamp = str(result.env.get("timestamp") or "")
    return datetime.datetime.fromisoformat(stamp).timestamp() if stamp else 0.0


def _beside(result: Result, runs: list[Result]) -> Result | None:
    """The defaults' run of the same data and minutes that finished within `BESIDE_SECONDS` of `result`."""
    key = (result.doc["dataset"], result.minutes)
    near = [
        run
        for run in runs
        if (run.doc["dataset"], run.minutes) == key
        and abs(_finished(run) - _finished(result)) <= BESIDE_SECONDS
        and run.threads == result.threads
    ]
    return min(near, key=lambda run: abs(_finished(run) - _finished(result))) if near else None


def _frozen_rows(page: Page, runs: list[Result], frozen: list[Result]) -> list[list[Any]]:
    rows = []
    for result in frozen:
        doc, control = result.doc, _beside(result, runs)
        model = doc.get("model") or {}
        rows.append(
            [
                LABELS.get(doc["dataset"], doc["dataset"]),
                f"{result.minutes:g}",
                result.seed(),
                f"neck {model.get('neck_width')}, head depth {model.get('head_depth')}",
                f"{doc.get('images_stored', 0):,} in {doc.get('store_s', 0):.0f} s",
                f"{doc.get('steps') or 0:,}",
                f3(doc.get("mAP50")),
                f3(without_rare(doc)),
                f"{f3(control.doc.get('mAP50'))} ({control.doc.get('steps') or 0:,} steps)"
                if control
                else "-",
                ", ".join(f"{name} {f3(ap)}" for name, ap in (doc.get("per_class_AP50") or {}).items()),
                page.cite(result.name) + (f", {page.cite(control.name)}" if control else ""),
            ]
        )
    return rows


def _frozen_sentences(runs: list[Result], frozen: list[Result]) -> list[str]:
    sentences = []
    for result in frozen:
        control = _beside(result, runs)
        if control is None or result.doc.get("mAP50") is None or control.doc.get("mAP50") is None:
            continue
        difference = result.doc["mAP50"] - control.doc["mAP50"]
        budget, stored = 60 * (result.minutes or 0), result.doc.get("store_s") or 0
        cost = (
            f"; the one pass over its {result.doc.get('images_stored', 0):,} training images took {stored:.0f} s "
            f"of the {budget:.0f}, leaving {result.doc.get('steps') or 0:,} steps"
            if budget and stored > budget / 2
            else ""
        )
        sentences.append(
            f"{LABELS.get(result.doc['dataset'], result.doc['dataset'])}, {result.minutes:g} minutes, seed "
            f"{result.seed()}: frozen features {f3(result.doc['mAP50'])} against the defaults' "
            f"{f3(control.doc['mAP50'])} trained beside it ({difference:+.3f}){cost}."
        )
    if sentences and all(
        (r.doc.get("mAP50") or 0) < (c.doc.get("mAP50") or 0)
        for r in frozen
        if (c := _beside(r, runs)) is not None
    ):
        sentences.append(
            "In every pair the defaults led: on a CPU, frozen ImageNet features under a trained neck and head "
            "are not a better start than tiny trained end to end, and `train` keeps tiny."
        )
    return sentences


def _frozen_features(page: Page, runs: list[Result], results: dict[str, Result]) -> None:
    """Frozen lite0 features with only the neck and head trained, beside the defaults trained at the same time."""
    frozen = sorted(
        (r for name, r in results.items() if name.startswith("frozen_features_") and not r.dirty),
        key=lambda r: (r.doc["dataset"], r.minutes or 0, r.seed(), r.name),
    )
    page.prose("frozen-imagenet-features")
    if not frozen:
        page.prose("no-frozen-features-run")
        return
    page.para(*_frozen_sentences(runs, frozen))
    page.table(
        (
            "data",
            "minutes",
            "seed",
            "neck and head",
            "images stored, time",
            "steps",
            "mAP@0.5",
            "mAP@0.5 without crack (AGDD)",
            "the defaults trained beside it",
            "AP@0.5 per class",
            "files",
        ),
        _frozen_rows(page, runs, frozen),
    )


def is_step_matched(result: Result) -> bool:
    """A run trained for a set number of epochs (`--set epochs=N`): compared with its control, not with the
    defaults of a time budget."""
    return "epochs" in (result.doc.get("overrides") or {})


def _changes(result: Result, control: Result | None = None) -> dict[str, Any]:
    """What a step-matched run changed: its settings other than the epochs (those the control also set, or
    chose by itself, left out) and the weights it started from, when not the shipped ones."""
    shared = _flat((control.doc.get("overrides") or {}) if control is not None else {})
    if control is not None:  # what the control's run chose by itself is no change either
        chosen = {choice["name"]: choice["value"] for choice in control.doc.get("choices") or []}
        shared = {**chosen, **shared}
    changed = {
        key: value
        for key, value in _flat(result.doc.get("overrides") or {}).items()
        if key != "epochs" and shared.get(key, object()) != value
    }
    start = result.doc.get("start_weights")
    if start:
        changed["start weights"] = Path(start["file"]).name
    return changed


def _control(result: Result, runs: list[Result]) -> Result | None:
    """The run of the same data, seed and epochs that changed nothing else: from the shipped weights, with a
    subset of the run's settings (the most of them)."""
    epochs = result.doc["overrides"]["epochs"]
    settings = _flat(result.doc["overrides"])
    candidates = [
        other
        for other in runs
        if other is not result
        and other.doc["dataset"] == result.doc["dataset"]
        and other.seed() == result.seed()
        and not other.doc.get("start_weights")
        and (other.doc.get("overrides") or {}).get("epochs") == epochs
        and _flat(other.doc["overrides"]).items() <= settings.items()
        and _changes(result, other)
    ]
    return max(candidates, key=lambda other: len(other.doc["overrides"]), default=None)


def _step_matched(page: Page, runs: list[Result]) -> None:
    """Treatment against control at the same number of epochs: the same optimizer steps and schedule, so the
    machine's load, which moves how many steps a time budget buys, does not enter the comparison."""
    rows = []
    for result in runs:
        control = _control(result, runs)
        if control is None:
            continue
        value, base = _score(result), _score(control)
        rows.append(
            [
                LABELS.get(result.doc["dataset"], result.doc["dataset"]),
                ", ".join(f"`{key}={value}`" for key, value in _changes(result, control).items()),
                result.doc["overrides"]["epochs"],
                result.seed(),
                f"{control.doc.get('steps') or 0:,} / {result.doc.get('steps') or 0:,}",
                f"{f3(base)} / {f3(value)}",
                f"{value - base:+.3f}",
                f"{f1(control.doc.get('train_wall_s', 0) / 60)} / {f1(result.doc.get('train_wall_s', 0) / 60)}",
                ", ".join(
                    f"{name} {f3(ap)}" for name, ap in (result.doc.get("per_class_AP50") or {}).items()
                ),
                f"{page.cite(control.name)}, {page.cite(result.name)}",
            ]
        )
    if not rows:
        return
    page.prose("pairs-of-runs-trained-for")
    page.table(
        (
            "data",
            "changed",
            "epochs",
            "seed",
            "steps, control / changed",
            "mAP@0.5 (AGDD: without crack), control / changed",
            "difference",
            "training minutes, control / changed",
            "AP@0.5 per class, changed",
            "files",
        ),
        rows,
    )


def _distilled(page: Page, distill: Result | None, runs: list[Result]) -> None:
    """How the start weights named `tiny_plain_distilled.pt` in the pairs above were made (bench/distill.py),
    and what they changed on average per dataset."""
    if distill is None or distill.dirty:
        return
    doc = distill.doc
    images = doc["provenance"]["images"]
    settings = doc["settings"]
    differences: dict[str, list[float]] = {}
    for result in runs:
        control = _control(result, runs)
        if control is not None and "start weights" in _changes(result, control):
            label = LABELS.get(result.doc["dataset"], result.doc["dataset"])
            differences.setdefault(label, []).append(_score(result) - _score(control))
    outcome = "; ".join(
        f"{label}: {statistics.mean(values):+.3f} on average over {len(values)} seeds "
        f"({min(values):+.3f} to {max(values):+.3f})"
        for label, values in differences.items()
    )
    page.prose(
        "distilled-imagenet-features",
        synthetic=f"{sum(images['synthetic'].values()):,}",
        photographs=images["real"],
        steps=f"{settings['steps']:,}",
        batch=settings["batch"],
        crop=settings["crop"],
        first_loss=f2(doc["curve"][0]["loss"]),
        last_loss=f2(doc["curve"][-1]["loss"]),
        machine=distill.machine,
        cited=page.cite(distill.name),
        outcome=outcome or "no pair recorded yet",
    )


def _seed_spread(runs: list[Result]) -> float | None:
    spreads = []
    for dataset in LABELS:
        for minutes in {r.minutes for r in runs if r.doc["dataset"] == dataset}:
            values = [_score(r) for r in runs if r.doc["dataset"] == dataset and r.minutes == minutes]
            if len(values) > 1:
                spreads.append(max(values) - min(values))
    return max(spreads) if spreads else None


def _score(result: Result) -> float:
    """What tried runs are ranked by: mAP@0.5, without crack on AGDD."""
    rare = without_rare(result.doc)
    return rare if rare is not None else result.doc.get("mAP50") or 0.0


def _gap_sentences(runs: list[Result], tried: list[Result]) -> list[str]:
    """Per dataset with tried runs at 10 minutes: the best tried run's figure against the defaults'."""
    sentences = []
    for dataset, label in LABELS.items():
        defaults = [r for r in runs if r.doc["dataset"] == dataset and r.minutes == 10]
        mine = [r for r in tried if _baseline(r, runs)[0] == dataset and r.minutes == 10]
        if not mine or _mean(defaults) is None:
            continue
        best = max(mine, key=_score)
        value = best.doc.get("mAP50") or 0.0
        rare = without_rare(best.doc)
        base = _mean_without_rare(defaults) if rare is not None else _mean(defaults)
        verdict = "none beats the defaults; the best" if _score(best) <= (base or 0.0) else "the best"
        sentences.append(
            f"{label} at 10 minutes: the defaults reach {f3(_mean(defaults))}; of {len(mine)} tried, {verdict} is "
            f"{_changed(best)} at {f3(value)}" + (f", {f3(rare)} without crack." if rare is not None else ".")
        )
    return sentences


def _false_call_sentences(page: Page, result: Result, explain: bool) -> list[str]:
    doc = result.doc
    at = doc["at_bundle_threshold"]
    classes = ", ".join(f"{name} {count}" for name, count in at["per_class"].items())
    points = "; ".join(
        f"at most {pct(point['target_escape_rate'])} escapes: {pct(point['false_call_rate'])} of them flagged"
        for point in doc["operating_points"]
    )
    return [
        f"{LABELS.get(doc['dataset'], doc['dataset'])}{_trained_with(page, doc)} ({page.cite(result.name)}, the "
        f"bundle of `{Path(doc['bundle']).parent.name}`): at its threshold "
        f"{at['threshold']:.3f} it flags {at['boards_flagged']} of {doc['clean_boards']} defect-free boards with "
        f"{at['boxes']} boxes: {classes}.",
        f"With the threshold set on these boards: {points}.",
        *_as_they_are(doc, explain),
    ]


def _trained_with(page: Page, doc: dict[str, Any]) -> str:
    """', trained with `key=value`' (and the start weights) when the bundle's run changed them from the
    defaults."""
    run = page.results.get(Path(doc["bundle"]).parent.name)
    if run is None:
        return ""
    changed = dict(_flat(run.doc.get("overrides") or {}))
    if run.doc.get("start_weights"):
        changed["start weights"] = Path(run.doc["start_weights"]["file"]).name
    return (
        (", trained with " + ", ".join(f"`{key}={value}`" for key, value in changed.items()))
        if changed
        else ""
    )


def _as_they_are(doc: dict[str, Any], explain: bool) -> list[str]:
    raw = doc.get("templates_as_they_are")
    if not raw:
        return []
    sentences = [
        f"The templates as they are, without the recapture nuisances: {raw['boards_flagged']} of {raw['boards']} "
        "flagged."
    ]
    if explain and doc["dataset"].startswith("deeppcb"):
        sentences.append(
            "The picture shows the highest-scoring false box of each board. On DeepPCB they are round holes the boards are designed with (their templates hold them), called "
            "pin-hole: one image does not tell a designed hole from a pin-hole; the template does (no false call "
            "with templates, runs table above)."
        )
    return sentences


def _false_calls(page: Page, results: dict[str, Result]) -> None:
    """The false calls of recorded bundles on defect-free boards, with the picture of the highest-scoring ones
    and, where the run drew it, the labelled defects of the class they are called."""
    found = [r for name, r in sorted(results.items()) if name.startswith("false_calls_") and not r.dirty]
    if not found:
        return
    page.prose("what-the-false-calls-are")
    for result in found:
        page.para(*_false_call_sentences(page, result, result is found[0]))
    shown = next((r for r in found if (RESULTS_DIR / f"{r.name}_labelled.png").is_file()), found[0])
    # one run's pictures: the others look alike (their files have theirs)
    _copy_picture(
        page, f"{shown.name}.png", "the highest-scoring boxes on defect-free boards, with class and score"
    )
    called = next(iter(shown.doc["at_bundle_threshold"]["per_class"]), None)
    if called is not None:
        caption = f"labelled {called} defects of the same split, cut out the same way"
        if _copy_picture(page, f"{shown.name}_labelled.png", caption):
            page.prose("false-calls-beside-labels", cited=page.cite(shown.name), called=called)


def _copy_picture(page: Page, name: str, caption: str) -> bool:
    """A picture from bench/results/ onto the page (copied beside the page's plots); False when there is none."""
    import shutil

    picture = RESULTS_DIR / name
    if not picture.is_file():
        return False
    IMG.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(picture, IMG / picture.name)
    page.image(picture.name, caption)
    return True


def _diagnosis(page: Page, diagnosis: Result | None) -> None:
    """What limits AGDD with one lighting, from bench/agdd_diagnose.py."""
    if diagnosis is None or diagnosis.dirty:
        return
    doc = diagnosis.doc
    page.heading(2, "What limits AGDD with one lighting")
    fit = doc.get("fit") or {}
    if fit:
        page.table(
            ("images scored", "images", "mAP@0.5", "AP@0.5 per class"),
            [
                [
                    part["what"],
                    part["images"],
                    f3(part["mAP50"]),
                    ", ".join(f"{name} {f3(ap)}" for name, ap in (part.get("class_AP50") or {}).items()),
                ]
                for part in fit.values()
            ],
        )
    rows = [
        [
            split,
            lighting,
            name,
            entry["boxes"],
            f2(entry["median_ratio"]),
            pct(entry["faint_share"]),
        ]
        for split, lightings in (doc.get("contrast") or {}).items()
        for lighting, classes in lightings.items()
        for name, entry in classes.items()
    ]
    page.table(
        (
            "split",
            "lighting",
            "class",
            "boxes",
            "median contrast ratio",
            f"boxes under {doc['faint_ratio']:g}x (barely visible)",
        ),
        rows,
    )
    model = (
        f" The model is the last checkpoint of {page.cite(doc['run_result'])}."
        if doc.get("run_result")
        else ""
    )
    page.para(
        *doc.get("reading", []),
        f"From {page.cite(diagnosis.name)}: `{doc.get('command', '')}`.{model}",
    )


def _board_sentences(runs: list[Result]) -> list[str]:
    """DeepPCB without templates: defect-free boards flagged, and escapes, at the bundle's threshold."""
    sentences = []
    for result in runs:
        boards = result.doc.get("boards") or {}
        if result.doc["dataset"] != "deeppcb_plain" or not boards.get("clean_boards"):
            continue
        sentences.append(
            f"At its bundle's threshold the {result.minutes:g}-minute DeepPCB run without templates (seed "
            f"{result.seed()}) flags {100 * boards['false_call_rate']:.0f} % of the defect-free boards with "
            f"{100 * boards['escape_rate']:.1f} % escapes."
        )
    return sentences


def _minutes_sentences(runs: list[Result]) -> list[str]:
    """Per AGDD dataset run at more than one budget: mAP@0.5 without crack per budget."""
    sentences = []
    for dataset, label in LABELS.items():
        mine = [r for r in runs if r.doc["dataset"] == dataset and without_rare(r.doc) is not None]
        budgets = sorted({r.minutes for r in mine})
        if len(budgets) > 1:
            figures = [
                f"{f3(_mean_without_rare([r for r in mine if r.minutes == m]))} at {m:g} minutes"
                for m in budgets
            ]
            sentences.append(f"Without crack, {label} goes " + ", ".join(figures) + ".")
    return sentences


def _step_sentences(runs: list[Result]) -> list[str]:
    """Where seeds of one dataset and budget took different numbers of steps: the load changed during a run."""
    sentences = []
    for dataset, label in LABELS.items():
        for minutes in sorted({r.minutes for r in runs if r.doc["dataset"] == dataset}):
            same = [r for r in runs if r.doc["dataset"] == dataset and r.minutes == minutes]
            steps = [int(r.doc.get("steps") or 0) for r in same]
            if len(same) > 1 and max(steps) > 1.2 * min(steps):
                probes = [r.doc["speed_probe"]["ms_per_step"] for r in same]
                sentences.append(
                    f"The {len(same)} runs of {label} at {minutes:g} minutes took {min(steps):,} to {max(steps):,} "
                    f"steps at speed probes of {min(probes):.0f} to {max(probes):.0f} ms: the probe is taken once "
                    "before training and does not see load that changes during a run on a shared machine."
                )
    return sentences


def _weakest(runs: list[Result]) -> list[str]:
    """A sentence per dataset: its weakest class, leaving out AGDD's crack (too rare in its val split)."""
    sentences = []
    for dataset, label in LABELS.items():
        classes: dict[str, list[float]] = {}
        for result in runs:
            if result.doc["dataset"] == dataset:
                for name, value in (result.doc.get("per_class_AP50") or {}).items():
                    if value is not None and not (dataset.startswith("agdd") and name == "crack"):
                        classes.setdefault(name, []).append(value)
        if classes:
            name = min(classes, key=lambda key: statistics.fmean(classes[key]))
            mean = statistics.fmean(classes[name])
            sentences.append(
                f"The weakest class of {label} is {name} (AP@0.5 {f3(mean)}, mean over its runs)."
            )
    return sentences


def real_data_markdown(results: dict[str, Result]) -> str:
    """The markdown of docs/benchmarks/real-data.md."""
    return page_real_data(results, []).text()
