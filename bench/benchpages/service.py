"""Service page: serve under load and abuse, the loop on a shifted line."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .core import (
    Page,
    Result,
    count,
    f1,
    f2,
    f3,
    pct,
    save_figure,
    threads_text,
)

ABUSE_PROBES = (
    ("idle_sockets", "200 sockets that send nothing"),
    ("stalled_uploads", "20 uploads stopped half-way"),
    ("oversize_png", "PNG header claiming 100000 x 100000"),
    ("oversize_jpeg", "JPEG header claiming 60000 x 60000"),
    ("oversize_tiff", "TIFF header claiming 50000 x 50000"),
    ("oversize_hdr", "Radiance HDR header claiming 8000 x 8000"),
    ("cross_site_form_reset", "drift reset posted from another site's form"),
    ("reset_without_header", "drift reset without `X-Defectdet-Request`"),
    ("cross_site_detect", "detect with another Origin"),
    ("rebinding_host", "`Host: evil.example` (DNS rebinding)"),
    ("malformed_http", "bytes that are not HTTP"),
    ("unknown_route", "an unknown route"),
    ("missing_token", "`--token-file` set, no token"),
)


def _status(answer: dict[str, Any]) -> str:
    if "status" in answer:
        return str(answer["status"])
    return str(answer.get("status_line", "-")).removeprefix("HTTP/1.1 ")


def conclusion_service(page: Page, plots: list[Callable[[], None]]) -> None:
    """What a user should take from the page, with the plot of served against in-process throughput."""
    load = page.r("serve_load").doc
    abuse = page.r("serve_abuse").doc.get("summary") or {}
    shifted = page.r("loop_shift").doc["figures"]["loop_on_shifted"]
    page.prose(
        "what-to-conclude-one-2",
        f1_load_steady_requests_per_s=f1(load["steady"]["requests_per_s"]),
        abuse_get_status_500_0=abuse.get("status_500", 0),
        f3_shifted_models_old_map50=f3(shifted["models"]["old"]["mAP50"]),
        f3_shifted_models_new_map50=f3(shifted["models"]["new"]["mAP50"]),
    )
    page.image("service.png", "requests per second against clients, served over HTTP and in-process")
    plots.append(lambda: plot_service(page.results))


def plot_service(results: dict[str, Result]) -> None:
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for name, config in results["serve_overhead"].doc["configurations"].items():
        clients = [level["clients"] for level in config["levels"]]
        label = OVERHEAD_CONFIGS.get(name, name).replace("`", "")
        served = [level["served"]["requests_per_s"] for level in config["levels"]]
        axis.plot(clients, served, "o-", label=f"served, {label}")
        if name == "default":
            in_process = [level["in_process"]["requests_per_s"] for level in config["levels"]]
            axis.plot(clients, in_process, "s--", color="gray", label="in-process Predictor")
    axis.set_xlabel("clients at once")
    axis.set_ylabel("requests per second")
    axis.set_title("640 x 640 image and template per request, 2-core CPU")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    save_figure(figure, "service.png")


def page_service(results: dict[str, Result], plots: list[Callable[[], None]]) -> Page:
    page = Page("service", "Service", results)
    load = page.r("serve_load").doc
    steady, over = load["steady"], load["overload"]
    conclusion_service(page, plots)
    page.prose("defectdet-serve-under-load-under")
    rss = load["rss_mib"]
    page.prose(
        "a-deeppcb-nano-bundle-served",
        load_settings_max_concurrency=load["settings"]["max_concurrency"],
        load_settings_max_queue=load["settings"]["max_queue"],
        page_results_serve_load_machine=page.results["serve_load"].machine,
        page_cite_serve_load=page.cite("serve_load"),
        f1_steady_requests_per_s=f1(steady["requests_per_s"]),
        f1_load_overload_probe_healthz_p50=f1(load["overload_probe"]["healthz"]["p50"]),
        f1_rss_growth=f1(rss["growth"]),
        count_steady_requests=count(steady["requests"]),
    )
    rows = []
    for label, phase in (("steady", steady), ("overload", over)):
        statuses = ", ".join(f"{n:,} x {code}" for code, n in sorted(phase["statuses"].items()))
        rows.append(
            [
                label,
                phase["clients"],
                count(phase["requests"]),
                f1(phase["requests_per_s"]),
                f"{phase['latency_ms_200']['p50']:.0f} / {phase['latency_ms_200']['p99']:.0f}",
                f"{phase['server_timings_ms_p50']['total']:.0f} / {phase['server_total_ms_p99']:.0f}",
                statuses,
            ]
        )
    headers = (
        "phase",
        "clients",
        "requests",
        "requests/s",
        "client p50 / p99 ms",
        "server p50 / p99 ms",
        "answers",
        "machine",
        "file",
    )
    machine = page.results["serve_load"].cpu
    page.table(headers, [[*row, machine, page.cite("serve_load")] for row in rows])
    stages = steady["server_timings_ms_p50"]
    page.para(
        "Inside the service a steady request took (p50, ms): "
        + ", ".join(
            f"{stage} {f1(stages[stage])}"
            for stage in ("receive", "queue", "decode", "letterbox", "model", "postprocess", "drift")
        )
        + ".",
    )
    if "serve_overhead" in page.results and not page.results["serve_overhead"].dirty:
        section_overhead(page)
    section_abuse(page)
    if "drift" in page.results and not page.results["drift"].dirty:
        section_drift(page)
    section_loop_shift(page)
    return page


OVERHEAD_CONFIGS = {
    "default": "defaults",
    "keep_and_models_dir": "`--keep flagged` + `--models-dir`",
    "workers_2": "`--workers 2`",
}


def section_overhead(page: Page) -> None:
    """The service against the in-process Predictor, side by side in one run (bench/serve_overhead.py)."""
    page.heading(2, "Against the in-process Predictor")
    result = page.r("serve_overhead")
    doc = result.doc
    targets = doc["targets"]
    page.prose(
        "the-same-bundle-and-the",
        result_machine=result.machine,
        load_average=", ".join(str(v) for v in result.env["machine"].get("load_average", [])),
        page_cite_serve_overhead=page.cite("serve_overhead"),
        targets_throughput_ratio_at_4=targets["throughput_ratio_at_4"],
        f1_targets_p50_overhead_ms_at_1=f1(targets["p50_overhead_ms_at_1"]),
    )
    rows = []
    for name, config in doc["configurations"].items():
        for level in config["levels"]:
            ours, theirs = level["served"], level["in_process"]
            rows.append([
                OVERHEAD_CONFIGS.get(name, name), level["clients"], f1(theirs["requests_per_s"]),
                f1(ours["requests_per_s"]), f2(level["throughput_ratio"]),
                f"{f1(theirs['p50_ms'])} / {f1(ours['p50_ms'])}", f1(level["p50_overhead_ms"]),
                f"{f1(theirs['cpu_ms_per_request'])} / {f1(ours['cpu_ms_per_request'])}" + loop_part(ours),
                ours["errors"],
            ])  # fmt: skip
    headers = ("served with", "clients", "in-process req/s", "served req/s", "ratio",
               "p50 ms in-process / served", "p50 overhead ms",
               "CPU ms/request in-process / served (its event loop)", "errors")  # fmt: skip
    page.table(headers, rows)
    verdicts = doc["verdicts"]
    page.para(
        "Targets met: "
        + "; ".join(
            f"{OVERHEAD_CONFIGS.get(name, name)} {'yes' if verdict['met'] else 'no'} (ratio at 4 clients "
            f"{f2(verdict['throughput_ratio_at_4'])}, p50 overhead at 1 client {f1(verdict['p50_overhead_ms_at_1'])} ms)"
            for name, verdict in verdicts.items()
        )
        + ".",
    )
    if not all(verdict["met"] for verdict in verdicts.values()):
        page.prose("where-the-difference-goes", **difference_figures(doc))


DIFFERENCE_KEYS = (
    "clients",
    "cpu_gap",
    "loop_cpu",
    "floor_cpu",
    "floor_p50",
    "served_pipeline",
    "caller_pipeline",
)


def loop_part(served: dict) -> str:
    loop = served.get("server_loop_cpu_ms_per_request")
    return "" if loop is None else f" ({f1(loop)})"


def difference_figures(doc: dict) -> dict[str, str]:
    """The CPU the service adds per request at 4 clients with the defaults, its event loop's part, and the
    floor a bare ASGI app costs (older result files without these fields get dashes)."""
    levels = {level["clients"]: level for level in doc["configurations"].get("default", {}).get("levels", [])}
    level = levels.get(4) or next(iter(levels.values()), None)
    floor = doc.get("http_floor") or {}
    alone = levels.get(1, {})
    if level is None or "server_loop_cpu_ms_per_request" not in level["served"] or not alone:
        return dict.fromkeys(DIFFERENCE_KEYS, "-") | {"clients": "4"}
    gap = level["served"]["cpu_ms_per_request"] - level["in_process"]["cpu_ms_per_request"]
    return {
        "served_pipeline": f1(alone["server_timings_ms_p50"].get("compute", float("nan"))),
        "caller_pipeline": f1(alone["in_process"].get("pipeline_p50_ms", float("nan"))),
        "clients": str(level["clients"]),
        "cpu_gap": f1(gap),
        "loop_cpu": f1(level["served"]["server_loop_cpu_ms_per_request"]),
        "floor_cpu": f2(floor.get("server_cpu_ms_per_request", float("nan"))),
        "floor_p50": f2(floor.get("p50_ms", float("nan"))),
    }


def section_abuse(page: Page) -> None:
    page.heading(2, "Abuse")
    abuse = page.r("serve_abuse").doc
    settings = abuse["settings"]
    page.prose(
        "a-tiny-bundle-served-with",
        settings_max_concurrency=settings["max_concurrency"],
        settings_max_queue=settings["max_queue"],
        settings_connection_limit=settings["connection_limit"],
        page_results_serve_abuse_machine=page.results["serve_abuse"].machine,
        page_cite_serve_abuse=page.cite("serve_abuse"),
    )
    rows = []
    for key, label in ABUSE_PROBES:
        probe = abuse["probes"][key]
        rows.append(
            [
                label,
                _status(probe["answer"]),
                str(probe["answer"].get("body", {}).get("error", ""))[:90]
                if isinstance(probe["answer"].get("body"), dict)
                else "",
            ]
        )
    page.table(("probe", "status", "answer"), rows)
    outcome = abuse.get("summary")
    if outcome is not None:
        line = abuse["probes"]["line"]
        review, fleet = line["review_under_load"], line["fleet"]
        page.prose(
            "the-line-s-probes-bench",
            review_what_split_0=review["what"].split(":")[0],
            counts_review_second_tab=_counts(review["second_tab"]),
            counts_review_statuses=_counts(review["statuses"]),
            review_folder_decided=review["folder"]["decided"],
            outcome_labels_lost=outcome["labels_lost"],
            fleet_steps_promote_seconds=fleet["steps"]["promote"]["seconds"],
            fleet_steps_rollback_seconds=fleet["steps"]["rollback"]["seconds"],
            outcome_status_500=outcome["status_500"],
        )


def _counts(statuses: dict[str, int]) -> str:
    """`{"200": 3, "409": 1}` -> `3 x 200, 1 x 409`."""
    return ", ".join(f"{count} x {status}" for status, count in sorted(statuses.items()))


def section_loop_shift(page: Page) -> None:
    page.heading(2, "Before and after on a shifted line")
    result = page.r("loop_shift")
    doc = result.doc
    figures = doc["figures"]
    shifted = figures["loop_on_shifted"]["models"]
    page.prose(
        "a-line-whose-lamp-changes",
        doc_settings_new_images=doc["settings"]["new_images"],
        f3_shifted_old_map50=f3(shifted["old"]["mAP50"]),
        f3_shifted_new_map50=f3(shifted["new"]["mAP50"]),
        figures_loop_on_shifted_verdict=figures["loop_on_shifted"]["verdict"],
        result_machine=result.machine,
        threads_text_result_threads=threads_text(result.threads),
        page_cite_loop_shift=page.cite("loop_shift"),
    )
    rows = []
    for key, label in (
        ("loop_on_shifted", "fine-tuned on kept images, shifted line"),
        ("loop_on_line_a", "fine-tuned on kept images, line A"),
        ("control_on_shifted", "control, shifted line"),
        ("control_on_line_a", "control, line A"),
    ):
        models = figures[key]["models"]
        rows.append(
            [
                label,
                f"{f3(models['old']['mAP50'])} → {f3(models['new']['mAP50'])}",
                f"{pct(models['old']['escapes']['missed_defect_rate'])} → {pct(models['new']['escapes']['missed_defect_rate'])}",
                f"{pct(models['old']['false_calls']['false_call_rate'])} → {pct(models['new']['false_calls']['false_call_rate'])}",
                figures[key]["verdict"],
            ]
        )
    page.table(
        ("model, scored on", "mAP@0.5: deployed → new", "missed defects", "false calls", "compare says"), rows
    )


def section_drift(page: Page) -> None:
    page.heading(2, "Drift detection")
    result = page.r("drift")
    doc = result.doc
    alarms = doc["false_alarms"]
    bundle = next(value for key, value in alarms.items() if key.startswith("after"))
    loo = next(value for key, value in alarms.items() if key.startswith("leave one group out"))["new builder"]
    faults = doc["faults"]
    delays = [fault["after"]["images_to_alert"] for fault in faults.values()]
    training = doc["training_run"]
    minutes = re.search(r"--time (\d+)", training["command"]).group(1)
    page.prose(
        "a-deeppcb-training-preset-bundle",
        training_preset=training["preset"],
        minutes=minutes,
        f3_training_val_metrics_map50=f3(training["val_metrics"]["mAP50"]),
        alarms_stream_images_per_group=alarms["stream_images_per_group"],
        doc_camera_noise=doc["camera_noise"],
        bundle_groups_alarmed=bundle["groups_alarmed"],
        bundle_groups=bundle["groups"],
        loo_groups_alarmed=loo["groups_alarmed"],
        loo_groups=loo["groups"],
        min_delays=min(delays),
        max_delays=max(delays),
        doc_goal_images_to_alert_max=doc["goal"]["images_to_alert_max"],
        result_machine=result.machine,
        page_cite_drift=page.cite("drift"),
    )
    rows = [
        [
            name,
            fault["after"]["images_to_alert"],
            fault["after"]["statistic"],
            f3(fault["mAP50"]),
            pct(fault["boards_flagged"]),
        ]
        for name, fault in faults.items()
    ]
    clean = doc.get("clean_mAP50_with_camera_noise")
    page.table(
        (
            "fault on the tested image",
            "images to the alert",
            "statistic named",
            "mAP@0.5 under the fault",
            "defective boards still flagged",
        ),
        [["none (camera noise only)", "no alert", "-", f3(clean), "-"], *rows],
    )
    page.prose(
        "image-statistics-cost-p50-f2",
        f2_doc_image_statistics_ms_640_p50=f2(doc["image_statistics_ms_640"]["p50"]),
    )
