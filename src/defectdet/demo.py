"""The embedded default: synthesize -> check -> look at a batch -> train -> evaluate -> report. Offline."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

# A planning figure for how often to validate, not a promise: nano trained at 44.7 images/s on DeepPCB
# 320 px crops on 2 cores (bench/results/train_deeppcb_nano_20min.json, final.train_images_per_second).
EXPECTED_IMAGES_PER_SECOND = 45


def run_demo(
    out: str | Path,
    minutes: float = 5.0,
    boards: int = 160,
    seed: int = 0,
    preset: str = "nano",
    console: Console | None = None,
) -> dict:
    """Run the whole lifecycle on synthetic PCB boards and return the final metrics.

    Everything lands under `out`: `data/` (the dataset), `batch.png` (what the model is fed), `run/`
    (checkpoints, metrics.csv, plots, report.html).
    """
    from defectdet.data.check import run_check
    from defectdet.data.dataset import collate_detections
    from defectdet.data.synth import synthesize_dataset
    from defectdet.data.visualize import save_batch_grid
    from defectdet.engine.config import TrainConfig
    from defectdet.engine.trainer import build_train_data, train
    from defectdet.engine.validate import validate

    console = console or Console()
    out = Path(out)
    started = time.perf_counter()

    console.rule("1/4 synthesize")
    data_yaml = synthesize_dataset(out / "data", boards=boards, seed=seed, template=True)
    console.print(f"wrote {boards} synthetic boards with templates: {data_yaml}")

    console.rule("2/4 check")
    if run_check(data_yaml, console=console) != 0:
        raise RuntimeError(f"the synthetic dataset {data_yaml} failed its own check; this is a bug")

    config = TrainConfig(data=data_yaml, preset=preset, time_minutes=minutes, out=out / "run", seed=seed)
    data = build_train_data(config)
    # a small dataset makes short epochs: validate about 8 times in the budget, not after every few steps
    expected_epochs = minutes * 60 * EXPECTED_IMAGES_PER_SECOND / max(1, len(data.train))
    config.val_every = max(1, round(expected_epochs / 8))
    batch = collate_detections([data.train[i] for i in range(min(8, len(data.train)))])
    grid = save_batch_grid(batch[0], batch[1], data.class_names, out / "batch.png", template=data.template)
    console.print(
        f"a training batch (augmented {config.crop_size}px crops, boxes drawn, template beside): {grid}"
    )

    console.rule(f"3/4 train ({preset}, {minutes:g} min on the CPU)")
    result = train(config, data=data)

    console.rule("4/4 evaluate (held-out boards + their templates as clean boards)")
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
        f"{_fmt(headline.get('conf_threshold'))}: escape rate {_fmt(headline.get('escape_rate'))}, "
        f"false-call rate on clean boards {_fmt(headline.get('false_call_rate'))}, "
        f"{_fmt(headline.get('images_per_second'))} images/s"
    )
    console.print(f"checkpoint: {result.best_checkpoint}")
    console.print(
        f"report: {metrics['report']} (training curves and plots: {result.run_dir / 'report.html'})"
    )
    console.print(f"demo finished in {(time.perf_counter() - started) / 60:.1f} min")
    return metrics


def _fmt(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
