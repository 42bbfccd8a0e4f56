"""The embedded default: synthesize -> check -> look at a batch -> train -> evaluate -> export -> predict. Offline."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console

# the training budget; all steps stay within 8 minutes on 2 cores (bench/results/demo.json)
DEMO_MINUTES = 6.0


def run_demo(
    out: str | Path,
    minutes: float = DEMO_MINUTES,
    boards: int = 160,
    seed: int = 0,
    preset: str = "tiny",
    console: Console | None = None,
) -> dict:
    """Run the whole lifecycle on synthetic PCB boards and return the final metrics.

    Everything lands under `out`: `data/` (the dataset), `batch.png` (what the model is fed), `run/`
    (checkpoints, metrics.csv, plots, report.html).
    """
    from defectdet.engine.config import TrainConfig
    from defectdet.engine.trainer import train

    console = console or Console()
    out = Path(out)
    started = time.perf_counter()
    data_yaml = _synthesize_and_check(out, boards, seed, console)

    # tiny, not nano (the default for boards with templates): it learned these small synthetic boards faster per
    # CPU minute in our runs (the demo's figures: bench/results/demo.json)
    config = TrainConfig(data=data_yaml, preset=preset, time_minutes=minutes, out=out / "run", seed=seed)
    # the product's own schedule: validated after each tenth of the time budget (TrainConfig.val_every)
    data = _show_a_batch(config, out, console)

    console.rule(f"3/5 train ({config.preset}, {minutes:g} min on the CPU)")
    result = train(config, data=data)
    metrics = _evaluate(result, data_yaml, console)

    console.rule("5/5 export the bundle and run it without torch on the held-out boards")
    metrics["deploy"] = deploy_and_predict(
        result.best_checkpoint or result.last_checkpoint, data_yaml, out, console
    )
    console.print(f"demo finished in {(time.perf_counter() - started) / 60:.1f} min")
    return metrics


def _synthesize_and_check(out: Path, boards: int, seed: int, console: Console) -> Path:
    """Steps 1 and 2: the synthetic boards with templates in `out/data`, checked; their data.yaml."""
    from defectdet.data.check import run_check
    from defectdet.data.synth import synthesize_dataset

    console.rule("1/5 synthesize")
    data_yaml = synthesize_dataset(out / "data", boards=boards, seed=seed, template=True)
    console.print(f"wrote {boards} synthetic boards with templates: {data_yaml}")

    console.rule("2/5 check")
    if run_check(data_yaml, console=console) != 0:
        raise RuntimeError(f"the synthetic dataset {data_yaml} failed its own check; this is a bug")
    return data_yaml


def _show_a_batch(config: Any, out: Path, console: Console) -> Any:
    """The training data of `config`, and a picture of one training batch in `out/batch.png`."""
    from defectdet.engine.trainer import build_train_data
    from defectdet.trainingdata.dataset import collate_detections
    from defectdet.trainingdata.visualize import save_batch_grid

    data = build_train_data(config)
    batch = collate_detections([data.train[i] for i in range(min(8, len(data.train)))])
    grid = save_batch_grid(batch[0], batch[1], data.class_names, out / "batch.png", template=data.template)
    crop = (data.config or config).crop_size
    what = f"augmented {crop}px crops" if crop else "augmented whole images"
    console.print(f"a training batch ({what}, boxes drawn, template beside): {grid}")
    return data


def _evaluate(result: Any, data_yaml: Path, console: Console) -> dict:
    """Step 4: the trained checkpoint on the held-out boards, their templates as clean boards; the metrics."""
    from defectdet.engine.validate import validate

    console.rule("4/5 evaluate (held-out boards + their templates as clean boards)")
    metrics = validate(
        result.best_checkpoint or result.last_checkpoint,
        data_yaml,
        split="val",
        clean_templates=True,
        out=result.run_dir / "val",
        console=console,
    )
    headline = metrics.get("headline", {})
    console.print(
        f"mAP@0.5 {_fmt(headline.get('mAP50'))}, mAP@0.5:0.95 {_fmt(headline.get('mAP50_95'))}, "
        f"DeepPCB F-score {_fmt(headline.get('deeppcb_F'))}; operating threshold "
        f"{_fmt(headline.get('threshold'))}: escape rate {_fmt(headline.get('escape_rate'))}, "
        f"false-call rate on clean boards {_fmt(headline.get('false_call_rate'))}, "
        f"{_fmt(headline.get('images_per_second'))} images/s"
    )
    console.print(f"checkpoint: {result.best_checkpoint}")
    console.print(
        f"report: {metrics['report']} (training curves and plots: {result.run_dir / 'report.html'})"
    )
    return metrics


def deploy_and_predict(checkpoint: Path, data_yaml: Path, out: Path, console: Console) -> dict:
    """Export `checkpoint` to a bundle, then run the torch-free `Predictor` on the validation boards."""
    import cv2
    import numpy as np

    from defectdet.data.formats import load_dataset
    from defectdet.export.exporter import export_bundle
    from defectdet.runtime.predict import draw_detections
    from defectdet.runtime.predictor import Predictor

    exported = export_bundle(checkpoint, out / "model.onnx")
    threshold = exported.metadata.thresholds
    console.print(
        f"bundle {exported.bundle} ({exported.bundle.stat().st_size / 1024:.0f} KiB): eager vs onnxruntime max "
        f"|diff| {exported.parity_max_abs_diff:.1e}; operating threshold {threshold.threshold:.3f} ({threshold.threshold_source})"
    )
    predictor = Predictor(exported.bundle)
    drawn_dir = out / "predictions"
    drawn_dir.mkdir(parents=True, exist_ok=True)
    flagged = escaped = defective_boards = 0
    totals = []
    samples = load_dataset(data_yaml, "val").samples
    for index, sample in enumerate(samples):
        image, template = predictor.load_pair(
            sample.image_path, sample.template_path if predictor.metadata.template else None
        )
        found = predictor.predict(image, template)
        totals.append(found.timings["total"])
        has_defect = len(sample.boxes) > 0
        defective_boards += has_defect
        flagged += found.defective
        escaped += has_defect and not found.defective
        if index < 6:
            cv2.imwrite(str(drawn_dir / f"{Path(sample.image_path).stem}.png"), draw_detections(image, found))
    summary = {
        "bundle": str(exported.bundle),
        "boards": len(samples),
        "flagged": flagged,
        "defective_boards": defective_boards,
        "escaped": escaped,
        "mean_ms": round(float(np.mean(totals)), 2) if totals else None,
    }
    console.print(
        f"Predictor (onnxruntime, no torch) on {len(samples)} held-out boards: {flagged} flagged, "
        f"{escaped} of {defective_boards} defective boards escaped, {summary['mean_ms']} ms per board end to end; "
        f"annotated boards in {drawn_dir}"
    )
    return summary


def _fmt(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
