"""Rich tables for the doctor reports: what was found, then "what to do"."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from defectdet.diagnostics.report import Finding, advice_lines, format_bytes

STYLE = {"ok": "green", "info": "cyan", "warning": "yellow", "error": "bold red"}


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render_findings(findings: list[Finding], console: Console, title: str = "diagnosis") -> None:
    """The findings as a table, then the advice of warnings and errors as a numbered 'what to do' list."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("", no_wrap=True)
    table.add_column("")
    for finding in findings:
        table.add_row(f"[{STYLE[finding.severity]}]{finding.severity}[/]", finding.message)
    console.print(table)
    lines = advice_lines(findings)
    console.print("[bold]What to do[/bold]")
    if not lines:
        console.print("  nothing: no problem found")
    for number, line in enumerate(lines, 1):
        console.print(f"  {number}. {line}")


def render_environment(report: Any, console: Console) -> None:
    table = Table(title="environment", show_header=False, title_justify="left")
    table.add_column("", style="bold")
    table.add_column("")
    versions = ", ".join(
        f"{name} {version or '[red]missing[/]'}" for name, version in report.versions.items()
    )
    cpu = report.cpu
    flags = " ".join(f"{name}{'' if present else '[dim](no)[/]'}" for name, present in cpu.flags.items())
    table.add_row("versions", versions)
    table.add_row("CPU", f"{cpu.model}; {flags}; torch kernels: {report.torch_cpu_capability or '-'}")
    quota = f", container quota {cpu.cgroup_cpus:g}" if cpu.cgroup_cpus else ""
    load = f", load {cpu.load_average:.1f}" if cpu.load_average is not None else ""
    table.add_row(
        "cores",
        f"{cpu.physical_cores} physical, {cpu.logical_cpus} logical, {cpu.usable_cpus} usable{quota}{load}",
    )
    variables = (
        ", ".join(f"{k}={v}" for k, v in report.thread_variables.items()) or "no OMP/MKL variables set"
    )
    table.add_row(
        "threads",
        f"torch {report.torch_threads} intra-op, {report.torch_interop_threads} inter-op; {variables}",
    )
    gpus = "; ".join(
        f"{gpu['name']} ({format_bytes(gpu['memory_bytes'])}, sm {gpu['capability']}, CUDA {gpu['cuda']})"
        for gpu in report.gpus
    )
    table.add_row("GPU", gpus or "none")
    table.add_row("onnxruntime", ", ".join(report.onnxruntime_providers) or "not installed")
    table.add_row("disk", f"{format_bytes(report.disk_free_bytes)} free at {report.disk_path}")
    shm = (
        f"{format_bytes(report.shm_free_bytes)} free of {format_bytes(report.shm_total_bytes)}"
        if report.shm_total_bytes is not None
        else "not available"
    )
    table.add_row("/dev/shm", shm)
    if report.speed is not None:
        speed = report.speed
        table.add_row(
            "speed",
            f"matmul fp32 {speed.matmul_gflops:.0f} GFLOP/s ({speed.threads} threads), "
            f"{speed.matmul_gflops_one_thread:.0f} GFLOP/s (1 thread); conv {speed.conv_images_per_second:.0f} img/s "
            f"(32ch 112x112 3x3)",
        )
    console.print(table)
    render_findings(report.findings, console)


def render_checkpoint(report: Any, console: Console, show_all: bool = False, limit: int = 25) -> None:
    from defectdet.diagnostics.checkpoint_doctor import summary_line

    console.print(f"[bold]{report.path}[/bold]: {summary_line(report)}")
    dtypes = ", ".join(f"{dtype} x{count}" for dtype, count in report.dtypes.items())
    devices = ", ".join(f"{device} x{count}" for device, count in report.saved_devices.items())
    console.print(f"dtypes: {dtypes}; saved on: {devices}; compared with: {report.target or 'nothing'}")
    if report.contents:
        contents = Table(title="besides the weights", title_justify="left")
        contents.add_column("entry")
        contents.add_column("content")
        for key, summary in report.contents.items():
            contents.add_row(key, summary)
        console.print(contents)
    if report.target is not None:
        counts = report.counts
        console.print(
            f"keys: [green]{counts['match']} match[/], [red]{counts['missing']} missing[/], "
            f"[red]{counts['unexpected']} unexpected[/], [red]{counts['shape']} shape-mismatched[/]"
        )
    _render_key_rows(report, console, show_all, limit)
    _render_proposed_rules(report, console)
    render_findings(report.findings, console)


def _render_key_rows(report: Any, console: Console, show_all: bool, limit: int) -> None:
    """The tensors that do not match (`show_all`: every tensor), at most `limit` of them unless `show_all`."""
    rows = [row for row in report.rows if show_all or row.status != "match"]
    after = report.counts_after_proposal
    if not show_all and after is not None and not (after["missing"] or after["unexpected"] or after["shape"]):
        limit = min(limit, 6)  # a pure renaming: a few examples of each side say it all
        rows = (
            [r for r in rows if r.status == "missing"][:3]
            + [r for r in rows if r.status != "missing"][:3]
            + [r for r in rows if r.status == "missing"][3:]
        )
    if not rows:
        return
    table = Table(title="tensors" if show_all else "tensors that do not match", title_justify="left")
    table.add_column("key", overflow="fold", ratio=3)
    for column in ("status", "shape", "model shape", "dtype", "saved on"):
        table.add_column(column, no_wrap=True)
    for row in rows[:limit] if not show_all else rows:
        key = row.key if row.source_key is None else f"{row.key} [dim](file: {row.source_key})[/]"
        table.add_row(
            key,
            f"[{'green' if row.status == 'match' else 'red'}]{row.status}[/]",
            str(row.shape) if row.shape is not None else "-",
            str(row.expected_shape) if row.expected_shape is not None else "-",
            row.dtype or "-",
            row.device or "-",
        )
    console.print(table)
    if not show_all and len(rows) > limit:
        console.print(f"... {len(rows) - limit} more (--all lists every tensor, --json everything)")


def _render_proposed_rules(report: Any, console: Console) -> None:
    """The proposed mapping and what it would leave."""
    rules = report.proposed_rules
    if not rules:
        return
    table = Table(title="proposed mapping (applied in order; save with --save-map)", title_justify="left")
    for column in ("pattern", "replace", "why"):
        table.add_column(column)
    for rule in rules:
        table.add_row(rule.pattern, repr(rule.replace), rule.reason)
    console.print(table)
    after = report.counts_after_proposal
    if after is not None:
        console.print(
            f"with it: {after['match']} match, {after['missing']} missing, {after['unexpected']} unexpected, "
            f"{after['shape']} shape-mismatched"
        )


def render_loader(report: Any, console: Console) -> None:
    console.print(f"[bold]{report.dataset}[/bold]: {report.samples} samples, batch {report.batch_size}")
    if report.scan is not None:
        console.print(
            f"scanned {report.scan.scanned} sample(s) in a worker process in {report.scan.seconds:.1f} s: "
            f"{len(report.scan.problems)} problem(s)"
        )
    table = Table(title="loader settings", title_justify="left")
    for column in (
        "workers",
        "batch",
        "pin",
        "persistent",
        "prefetch",
        "first batch s",
        "next epoch s",
        "img/s from start",
    ):
        table.add_column(column, justify="right")
    for setting in report.settings:
        best = setting is report.best
        rate = "[red]" + setting.error[:60] + "[/]" if setting.error else f"{setting.images_per_second:.1f}"
        table.add_row(
            f"[bold green]{setting.workers}[/]" if best else str(setting.workers),
            str(setting.batch_size),
            "yes" if setting.pin_memory else "no",
            "yes" if setting.persistent_workers and setting.workers else "no",
            str(setting.prefetch_factor or "-"),
            _seconds(setting.first_batch_seconds),
            _seconds(setting.restart_seconds),
            rate,
        )
    console.print(table)
    if report.model_step is not None:
        step = report.model_step
        console.print(
            f"training step ({step.preset}, batch {step.batch_size}): {step.seconds_per_step:.3f} s = "
            f"{step.images_per_second:.1f} img/s; a batch is {format_bytes(report.batch_bytes)}"
        )
    render_findings(report.findings, console)


def render_nan(report: Any, console: Console, layers: int = 12) -> None:
    console.print(f"[bold]{report.model}[/bold]: {report.batches} batch(es), forward + backward per dtype")
    table = Table(title="passes", title_justify="left")
    for column in (
        "pass",
        "loss",
        "first NaN/Inf (forward)",
        "first NaN/Inf (backward)",
        "largest activation",
    ):
        table.add_column(column)
    for result in report.passes:
        losses = ", ".join(f"{loss:.4g}" for loss in result.losses) or "-"
        forward = result.forward_source
        backward = result.backward_source
        table.add_row(
            result.name,
            losses if not result.error else f"[red]{result.error[:50]}[/]",
            f"[red]{forward.module}[/] ({forward.module_type}, {forward.dtype}, {forward.kind})"
            if forward
            else "[green]none[/]",
            f"[red]{backward.module}[/] ({backward.module_type}, {backward.dtype})"
            if backward
            else "[green]none[/]",
            f"{result.max_activation:.3g} in {result.max_activation_module}",
        )
    console.print(table)
    for result in report.passes:
        source = result.forward_source or result.backward_source
        if source is None:
            continue
        for index, stats in enumerate(source.input_stats):
            console.print(f"  {result.name} '{source.module}' input {index}: {stats}")
        for index, stats in enumerate(source.output_stats):
            console.print(f"  {result.name} '{source.module}' output {index}: {stats}")
    first = report.passes[0] if report.passes else None
    if first is not None:
        ranked = sorted(
            (layer for layer in first.layers if layer.leaf),
            key=lambda layer: (-(layer.output_nonfinite + layer.gradient_nonfinite), -layer.output_absmax),
        )[:layers]
        table = Table(title=f"leaf modules with the largest outputs ({first.name})", title_justify="left")
        table.add_column("module", overflow="fold", ratio=3)
        for column in ("type", "dtype", "max |output|", "NaN/Inf out", "max |grad|", "NaN/Inf grad"):
            table.add_column(column, no_wrap=True)
        for layer in ranked:
            table.add_row(
                layer.module,
                layer.module_type,
                layer.output_dtype,
                f"{layer.output_absmax:.3g}",
                str(layer.output_nonfinite),
                f"{layer.gradient_absmax:.3g}",
                str(layer.gradient_nonfinite),
            )
        console.print(table)
    render_findings(report.findings, console)


def render_tensors(inspections: list[Any], console: Console) -> None:
    table = Table(title="tensors", title_justify="left")
    for column in (
        "name",
        "shape",
        "strides",
        "dtype",
        "device",
        "contiguous",
        "storage",
        "grad",
        "grad_fn chain",
    ):
        table.add_column(column)
    for item in inspections:
        table.add_row(
            item.name,
            str(item.shape),
            str(item.strides),
            item.dtype,
            item.device,
            "yes" if item.contiguous else ("channels_last" if item.channels_last else "[yellow]no[/]"),
            f"{format_bytes(item.storage_bytes)} @ {item.storage_pointer:#x} offset {item.storage_offset}",
            "requires_grad" if item.requires_grad else "-",
            " <- ".join(item.grad_fn_chain[:5]) or "-",
        )
    console.print(table)
    findings = [
        Finding(finding.severity, finding.topic, f"{item.name}: {finding.message}", finding.advice)
        for item in inspections
        for finding in item.findings
    ]
    render_findings(findings or [Finding("ok", "tensor", "no hidden copies or shared storage")], console)
