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
    page.para(
        "What to conclude: one 2-core PC can serve a line. With the defaults `defectdet serve` answered",
        f"{f1(load['steady']['requests_per_s'])} requests per second (a 640 x 640 image and its template each)",
        "with no error, refused an overload at once with 503 instead of queueing without end, and kept",
        "`/healthz` answering. HTTP costs part of the in-process speed (the plot: the same bundle answered by",
        "`Predictor` in the client's process and by the service). Malformed, oversized and hostile requests get",
        f"a JSON 4xx, never a 500 (answers with status 500: {abuse.get('status_500', 0)}). When the line changes,",
        f"the loop recovers: on a shifted line the fine-tuned model goes from mAP@0.5 {f3(shifted['models']['old']['mAP50'])}",
        f"to {f3(shifted['models']['new']['mAP50'])}. Per-run tables below.",
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
    page.heading(2, "How to read the tables")
    page.para(
        "`defectdet serve` under load, under abuse, and the loop on the line when the line changes.",
    )
    page.heading(2, "Load")
    rss = load["rss_mib"]
    page.para(
        f"A DeepPCB nano bundle served with the defaults ({load['settings']['max_concurrency']} at a time, queue",
        f"{load['settings']['max_queue']}) on loopback; each request is a 640 x 640 JPEG image and its template,",
        f"sent by async clients on the same 2 cores ({page.results['serve_load'].machine}, shared with other",
        f"work while it ran; {page.cite('serve_load')}). Below the limit it served {f1(steady['requests_per_s'])}",
        "requests per second with no error; overloaded, it refuses the excess at once with 503 and `/healthz`",
        f"stays answered (p50 {f1(load['overload_probe']['healthz']['p50'])} ms). Memory grew",
        f"{f1(rss['growth'])} MiB over {count(steady['requests'])} requests. The server's own log of the run:",
        "`serve_load.server.log`.",
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
    page.para(
        "The same bundle and the same 640 x 640 JPEG pair (image and template) answered by `Predictor` in the",
        "benchmark's process and by `defectdet serve` on loopback, in alternating blocks within each level so",
        f"that other work on the machine slows both alike ({result.machine}, shared with other long jobs while it",
        f"ran: load average {', '.join(str(v) for v in result.env['machine'].get('load_average', []))};",
        f"{page.cite('serve_overhead')}). Ratio: served / in-process requests per second; overhead: served p50",
        "minus in-process p50; CPU: milliseconds of CPU per request (server and clients, against the",
        f"in-process side's). Targets: at least {targets['throughput_ratio_at_4']} at 4 clients and at most",
        f"{f1(targets['p50_overhead_ms_at_1'])} ms at 1 client, with no error.",
    )
    rows = []
    for name, config in doc["configurations"].items():
        for level in config["levels"]:
            ours, theirs = level["served"], level["in_process"]
            rows.append([
                OVERHEAD_CONFIGS.get(name, name), level["clients"], f1(theirs["requests_per_s"]),
                f1(ours["requests_per_s"]), f2(level["throughput_ratio"]),
                f"{f1(theirs['p50_ms'])} / {f1(ours['p50_ms'])}", f1(level["p50_overhead_ms"]),
                f"{f1(theirs['cpu_ms_per_request'])} / {f1(ours['cpu_ms_per_request'])}", ours["errors"],
            ])  # fmt: skip
    headers = ("served with", "clients", "in-process req/s", "served req/s", "ratio",
               "p50 ms in-process / served", "p50 overhead ms", "CPU ms/request in-process / served", "errors")  # fmt: skip
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


def section_abuse(page: Page) -> None:
    page.heading(2, "Abuse")
    abuse = page.r("serve_abuse").doc
    settings = abuse["settings"]
    page.para(
        f"A tiny bundle served with `--max-concurrency {settings['max_concurrency']} --max-queue",
        f"{settings['max_queue']}` (connection limit {settings['connection_limit']}) on",
        f"{page.results['serve_abuse'].machine} ({page.cite('serve_abuse')}). Every answer is JSON with a 4xx or",
        "503 status, never a 500, and `/healthz` answered 200 during every probe.",
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
        page.para(
            f"The line's probes (`bench/serve_abuse_line.py`): for {review['what'].split(':')[0]} an operator",
            "decided the listed images while the keep cap deleted others and a client kept posting; a second tab",
            f"resending each decision on its old version got {_counts(review['second_tab'])}, decisions on images",
            "the cap had just deleted and names of 300 and 10,000 characters got 404 (all answers:",
            f"{_counts(review['statuses'])}). {review['folder']['decided']} decisions saved, labels lost:",
            f"{outcome['labels_lost']}. Two",
            f"processes on one models store converged after a promotion in {fleet['steps']['promote']['seconds']} s",
            f"and a roll-back in {fleet['steps']['rollback']['seconds']} s. Answers with status 500 in every probe:",
            f"{outcome['status_500']}.",
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
    page.para(
        "A line whose lamp changes: a model trained on line A (synthetic boards with templates) meets boards",
        "under a new lamp. `serve --keep` keeps the images worth a second look, an operator labels",
        f"{doc['settings']['new_images']} of them, `train --from` fine-tunes the deployed model on them mixed",
        "with the old data, and `compare` decides. The control fine-tunes the same steps on line A's images only.",
        f"On the shifted line the fine-tuned model goes from mAP@0.5 {f3(shifted['old']['mAP50'])} to",
        f"{f3(shifted['new']['mAP50'])} and `compare` says {figures['loop_on_shifted']['verdict']}; the control",
        f"does not fix the shift ({result.machine}, {threads_text(result.threads)}; {page.cite('loop_shift')}).",
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
    page.para(
        f"A DeepPCB {training['preset']} bundle (trained {minutes} minutes on five board groups, held-out mAP@0.5",
        f"{f3(training['val_metrics']['mAP50'])}) and the drift reference it stores. False alarms: streams of",
        f"{alarms['stream_images_per_group']} clean images per board group the reference never saw, with camera",
        f"noise ({doc['camera_noise']}). The bundle's reference raised {bundle['groups_alarmed']} alarms on",
        f"{bundle['groups']} held-out groups, and a reference built the same way from six groups raised",
        f"{loo['groups_alarmed']} on the seventh, for each of the {loo['groups']} groups. Every lens or lamp fault",
        f"below alerts within {min(delays)}-{max(delays)} images (goal: at most {doc['goal']['images_to_alert_max']}),",
        f"before accuracy has gone ({result.machine}; {page.cite('drift')}).",
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
    page.para(
        f"Image statistics cost p50 {f2(doc['image_statistics_ms_640']['p50'])} ms per 640 x 640 image.",
    )
