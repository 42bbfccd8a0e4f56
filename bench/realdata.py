"""The product's defaults on every real dataset under ../shared/datasets, at a time budget and a seed.

    python -m bench.realdata --dataset agdd_1light --minutes 10 --seed 0 --threads 1
    python -m bench.realdata                      # every dataset: 10 min (seeds 0, 1), 30 and 60 min (seed 0)
    python -m bench.realdata --summary            # mean and spread per dataset and budget -> realdata_summary.json
    python -m bench.realdata --rescore NAME --work RUN_FOLDER   # score a recorded run again, no training

Each run is `defectdet train DATA --time M` through the Python API (no setting changed), then the bundle is
exported and scored through the torch-free runtime at the bundle's own threshold, with the fragment merge the
export chose on the threshold split (`fragment_merge` records the classes, the export's evidence and the
report split's figures without it):

- `agdd_1light` / `agdd_2light`: AGDD with one lighting (`_L1`) or both lightings as separate images. Trained on
  its `train.json` alone, so the trainer holds out whole groups of it (both lightings of a sample together);
  the bundle's threshold is chosen on that held-out part, and everything is reported on AGDD's own `val.json`
  (other capture sessions).
- `agdd_pair`: AGDD's `_L1` images with their `_L2` capture as the second plane, through the template input
  (`template_file_name`): what a second aligned plane is worth with the template path as it is (registration
  and the difference plane included). Same split and threshold as above.
- `agdd_companion`: the same pairs with `_L2` as a companion capture (`companions: {"L2": ...}`): stacked as an
  extra plane as it is, no registration, no difference plane.
- `deeppcb_plain` / `deeppcb_template`: DeepPCB without / with its templates, held-out board groups as the
  validation split; the bundle's threshold is chosen on that split and reported on it too (optimistic for the
  escapes and false calls, not for mAP), clean boards are the templates recaptured (`val --clean-templates`).

`--start-weights FILE` (an experiment, needs `--tag`) starts the model from a pretrained-weights file of the
chosen preset (`defectdet.model.pretrained` format, e.g. `bench/distill.py`'s) instead of the shipped weights;
every setting stays as the defaults choose it, and the result file records the file under `start_weights`.

Before training (and again after it), a speed probe times a fixed small workload (nano, batch 8 of 256 px, fp32)
in the same process, so runs on machines of different speed can be compared. A run from a tree with uncommitted code is refused
unless `--allow-dirty` (then the file says `dirty: true`). Writes
`bench/results/realdata_<dataset>_<minutes>min_seed<k>[_<tag>].json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS_DIR,
    limit_threads,
    print_table,
    refuse_uncommitted,
    write_result,
)
from bench.result_schema import read_result

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
DATASETS = ("agdd_1light", "agdd_2light", "agdd_pair", "agdd_companion", "deeppcb_plain", "deeppcb_template")
DEFAULT_RUNS = ((10, 0), (10, 1), (30, 0), (60, 0))  # (minutes, seed)
WORK = Path("runs/bench_realdata")
PROBE = {"preset": "nano", "batch": 8, "crop": 256, "steps": 8}


def result_name(dataset: str, minutes: float, seed: int, tag: str = "") -> str:
    return f"realdata_{dataset}_{minutes:g}min_seed{seed}" + (f"_{tag}" if tag else "")


def speed_probe(threads: int) -> float:
    """Median ms per training step (forward, backward, AdamW) of `PROBE` on random data."""
    from bench.amp_cpu import time_steps

    return time_steps(PROBE["preset"], PROBE["batch"], PROBE["crop"], PROBE["steps"], threads, None)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`key=value` TrainConfig overrides (`augment.noise_prob=0`: a dotted key sets a nested field); values are
    read as YAML (`0.5`, `false`, `null`, `[8, 16]`)."""
    import yaml

    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--set {item!r}: expected key=value")
        *parents, leaf = key.strip().split(".")
        node = overrides
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SystemExit(f"--set {item!r}: {part} is set both as a value and as a group")
        value = yaml.safe_load(text)
        if isinstance(value, bool) and text.strip().lower() not in ("true", "false"):
            value = text.strip()  # YAML 1.1 reads off/on/yes/no as booleans: `class_balance=off` is the word
        node[leaf] = value
    return overrides


def _merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = _merged(merged.get(key) or {}, value) if isinstance(value, dict) else value
    return merged


def _l2(record: dict[str, Any]) -> str:
    return record["file_name"].replace("_L1.png", "_L2.png")


def _pair(record: dict[str, Any]) -> dict[str, Any]:
    """An `_L1` record with its `_L2` capture as the template plane."""
    return dict(record, template_file_name=_l2(record))


def _companion(record: dict[str, Any]) -> dict[str, Any]:
    """An `_L1` record with its `_L2` capture as the companion `L2`."""
    return dict(record, companions={"L2": _l2(record)})


def _coco_subset(source: Path, target: Path, keep, change=None) -> Path:
    """`source` COCO json with only the images whose file name passes `keep`, file names made absolute, each
    record passed through `change` when given."""
    document = json.loads(source.read_text())
    images = [dict(r, file_name=str(source.parent / "images" / r["file_name"])) for r in document["images"]]
    images = [r for r in images if keep(Path(r["file_name"]).name)]
    images = [change(r) for r in images] if change else images
    ids = {r["id"] for r in images}
    subset = {
        **document,
        "images": images,
        "annotations": [a for a in document["annotations"] if a["image_id"] in ids],
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(subset))
    return target


def agdd_plan(dataset: str, work: Path, shared: Path) -> dict[str, Any]:
    """Train on AGDD train.json (the trainer's grouped hold-out validates), threshold on that held-out part,
    report on val.json; one lighting keeps the `_L1` images, the pair gives each its `_L2` as the template,
    the companion dataset as the companion `L2`."""
    from defectdet.data.formats import load_dataset
    from defectdet.data.holdout import hold_out

    root = shared / "agdd"

    def keep(name: str) -> bool:
        return dataset == "agdd_2light" or name.endswith("_L1.png")

    change = {"agdd_pair": _pair, "agdd_companion": _companion}.get(dataset)
    folder = work / "data" / dataset
    train = _coco_subset(root / "train.json", folder / "train.json", keep, change)
    val = _coco_subset(root / "val.json", folder / "val.json", keep, change)
    held = {s.image_path.name for s in hold_out(load_dataset(train, "train"))[1].samples}
    heldout = _coco_subset(train, folder / "heldout" / "heldout.json", lambda name: name in held)
    return {
        "train": {"data": train},
        "threshold_on": {"data": heldout, "split": "heldout", "what": "the trainer's grouped held-out part"},
        "report_on": {"data": val, "split": "val", "what": "AGDD val.json (other capture sessions)"},
        "clean_templates": False,
    }


def deeppcb_plan(dataset: str, shared: Path) -> dict[str, Any]:
    root = shared / "deeppcb"
    held = {"data": root, "split": "val", "what": "DeepPCB held-out board groups (val)"}
    return {
        "train": {"data": root, "template": dataset == "deeppcb_template"},
        "threshold_on": held,
        "report_on": held,
        "clean_templates": True,
    }


def start_model(data: Any, config: Any, weights: Path) -> tuple[Any, dict[str, Any]]:
    """The model the trainer builds for `data` and `config`, started from the pretrained-weights file `weights`
    instead of the shipped one; returns it and what the result file records about the start."""
    from defectdet.engine.autoconfig import model_overrides
    from defectdet.model import build_model
    from defectdet.model.pretrained import transfer_weights

    model = build_model(
        config.preset,
        len(data.class_names),
        data.in_channels,
        data.template,
        data.companions,
        **model_overrides(config),
    )
    report = transfer_weights(model, weights)
    return model, {"file": str(weights), "summary": report.summary(), "provenance": report.provenance}


def train_run(
    dataset: str, minutes: float, seed: int, work: Path, shared: Path, args: argparse.Namespace
) -> tuple[dict[str, Any], Any, Any, dict]:
    """Train with the defaults (and `args.set`'s overrides, from `args.start_weights` when given); returns
    (plan, TrainData config, TrainResult, timings and the start weights' record)."""
    from defectdet.engine.config import TrainConfig
    from defectdet.engine.trainer import build_train_data, train

    plan = _plan(dataset, work, shared)
    base = {**plan["train"], "time_minutes": minutes, "seed": seed, "out": work / "run", "progress": False}
    config = TrainConfig(**_merged(base, parse_overrides(args.set)))
    data = build_train_data(config)
    config = data.config or config
    model, start = None, None
    if args.start_weights is not None:
        model, start = start_model(data, config, args.start_weights)
    started = time.perf_counter()
    result = train(config, data=data, model=model)
    wall = time.perf_counter() - started
    return plan, data, result, {"train_wall_s": wall, "start_weights": start}


def score_bundle(plan: dict[str, Any], checkpoint: Path, out: Path) -> dict[str, Any]:
    """Export `checkpoint` with thresholds (and the fragment merge) measured on the plan's threshold split, then
    score the bundle on the report split at the bundle's threshold, with its fragment merge and, when it merges
    any class, without. Returns the result file's scoring fields."""
    from defectdet.engine.validate import validate
    from defectdet.export.exporter import export_bundle

    chosen = plan["threshold_on"]
    bundle = export_bundle(
        checkpoint, out / "model.onnx", data=chosen["data"], split=chosen["split"], force=True
    )
    report = plan["report_on"]
    settings = {
        "split": report["split"],
        "protocol": "coco",
        "threshold_from": "bundle",
        "clean_templates": plan["clean_templates"],
    }
    metrics = validate(bundle.bundle, report["data"], out=out / "val", **settings)
    thresholds = bundle.metadata.thresholds.model_dump()
    merge = {
        "classes": thresholds.get("merge_fragments") or [],
        "chosen_on": chosen["what"],
        "evidence": bundle.metadata.metrics.get("fragment_merge") or {},
    }
    if merge["classes"]:
        plain = validate(
            bundle.bundle, report["data"], out=out / "val_unmerged", merge_fragments=False, **settings
        )
        merge["without"] = {
            "mAP50": plain["headline"].get("mAP50"),
            "per_class_AP50": (plain.get("coco") or {}).get("class_AP50"),
        }
    headline = metrics.get("headline", {})
    boards = metrics.get("boards") or {}
    return {
        "threshold": {
            "value": boards.get("threshold"),
            "chosen_on": chosen["what"],
            "reported_on": report["what"],
            "bundle": thresholds,
        },
        "mAP50": headline.get("mAP50"),
        "mAP50_95": headline.get("mAP50_95"),
        "per_class_AP50": (metrics.get("coco") or {}).get("class_AP50"),
        "per_class_AP50_95": (metrics.get("coco") or {}).get("class_AP50_95"),
        "fragment_merge": merge,
        "boards": boards,
        "boxes_at_threshold": {key: headline.get(key) for key in ("precision", "recall", "f1")},
        "clean_boards": metrics.get("clean_boards"),
    }


def _plan(dataset: str, work: Path, shared: Path) -> dict[str, Any]:
    return agdd_plan(dataset, work, shared) if dataset.startswith("agdd") else deeppcb_plan(dataset, shared)


def rescore(name: str, work: Path, shared: Path) -> Path:
    """Score a recorded run's final weights again with this commit's export and `val`, without training again:
    the result file keeps its training figures, takes the new scoring fields, and `trained_at` keeps the
    environment (commit, machine) of the training."""
    path = RESULTS_DIR / f"{name}.json"
    document = read_result(path)
    checkpoint = work / "run" / "last.pt"
    if not checkpoint.is_file():
        raise SystemExit(f"--rescore {name}: no {checkpoint} (the run's folder is --work)")
    scoring = score_bundle(_plan(document["dataset"], work, shared), checkpoint, work)
    body = {key: value for key, value in document.items() if key not in ("name", "environment", "trained_at")}
    body.update(scoring)
    body["trained_at"] = document.get("trained_at") or document["environment"]
    body["rescored_by"] = " ".join(["python -m bench.realdata", *sys.argv[1:]])
    written = write_result(name, body)
    print_table(name, ["figure", "value"], [[k, body[k]] for k in ("mAP50", "mAP50_95", "steps")])
    return written


def run(dataset: str, minutes: float, seed: int, args: argparse.Namespace, dirty: bool) -> Path:
    name = result_name(dataset, minutes, seed, args.tag)
    work = WORK / name
    threads = args.threads
    probe_ms = speed_probe(threads or _torch_threads())
    overrides = parse_overrides(args.set)
    plan, data, result, timings = train_run(dataset, minutes, seed, work, args.shared, args)
    probe_after_ms = speed_probe(threads or _torch_threads())  # the load may have changed while it trained
    scoring = score_bundle(plan, result.last_checkpoint, work)
    body = {
        "command": " ".join(["python -m bench.realdata", *sys.argv[1:]]),
        "dataset": dataset,
        "minutes": minutes,
        "seed": seed,
        "threads": threads,
        "dirty": dirty,
        "overrides": overrides,
        "note": "a shared machine (other work ran beside it; see environment.machine.load_average)",
        "speed_probe": {**PROBE, "ms_per_step": probe_ms, "ms_per_step_after": probe_after_ms},
        "settings": (data.config.to_dict() if data.config else {}),
        "choices": [choice.to_dict() for choice in data.choices],
        "checkpoint": "last (the final weights)",
        "steps": result.state.step,
        "train_wall_s": timings["train_wall_s"],
        **({"start_weights": timings["start_weights"]} if timings["start_weights"] else {}),
        "internal_held_out_mAP50": (result.final_metrics.get("headline") or {}).get("mAP50"),
        **scoring,
    }
    path = write_result(name, body)
    print_table(name, ["figure", "value"], [[k, body[k]] for k in ("mAP50", "mAP50_95", "steps")])
    return path


def _check_overrides(overrides: dict[str, Any], tag: str) -> None:
    """Refuse overrides TrainConfig does not take, and an experiment that would write a defaults' file name."""
    from pydantic import ValidationError

    from defectdet.engine.config import TrainConfig

    if not tag:
        raise SystemExit("--set makes an experiment: name it with --tag")
    try:
        TrainConfig(**overrides)
    except ValidationError as error:
        raise SystemExit(f"--set: {error}") from None


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def summary() -> Path:
    """Mean and spread of mAP@0.5 per dataset and budget over the seeds run."""
    groups: dict[tuple[str, float], list[dict]] = {}
    for path in sorted(RESULTS_DIR.glob("realdata_*min_seed*.json")):
        document = read_result(path)
        groups.setdefault((document["dataset"], float(document["minutes"])), []).append(document)
    rows, table = [], []
    for (dataset, minutes), runs in sorted(groups.items()):
        values = [run["mAP50"] for run in runs if run.get("mAP50") is not None]
        entry = {
            "dataset": dataset,
            "minutes": minutes,
            "runs": [run["name"] for run in runs],
            "mAP50_mean": statistics.fmean(values) if values else None,
            "mAP50_spread": (max(values) - min(values)) if len(values) > 1 else None,
            "speed_probe_ms": [run["speed_probe"]["ms_per_step"] for run in runs],
        }
        rows.append(entry)
        table.append([dataset, minutes, len(values), entry["mAP50_mean"], entry["mAP50_spread"]])
    print_table("real data", ["dataset", "minutes", "runs", "mAP50 mean", "spread"], table)
    payload = {"command": "python -m bench.realdata --summary", "rows": rows}
    return write_result("realdata_summary", payload, directory=RESULTS_DIR)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", choices=DATASETS, action="append", help="default: every dataset")
    parser.add_argument("--minutes", type=float, action="append", help="default: 10 (two seeds), 30, 60")
    parser.add_argument("--seed", type=int, action="append", help="default: 0 and 1 at 10 minutes, else 0")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--tag", default="", help="appended to the file name")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a training setting changed from the defaults (an experiment; needs --tag), e.g. "
        "augment.noise_prob=0; repeatable",
    )
    parser.add_argument(
        "--start-weights",
        type=Path,
        metavar="FILE",
        help="start from this pretrained-weights file instead of the shipped one (an experiment; needs --tag)",
    )
    parser.add_argument("--shared", type=Path, default=SHARED, help="the folder holding agdd/ and deeppcb/")
    parser.add_argument("--allow-dirty", action="store_true", help="run from uncommitted code (recorded)")
    parser.add_argument("--summary", action="store_true", help="aggregate the result files, train nothing")
    parser.add_argument(
        "--rescore",
        metavar="NAME",
        help="score the recorded run NAME (a result file's name) again from its final weights in --work",
    )
    parser.add_argument("--work", type=Path, help="with --rescore: the run's folder (holds run/last.pt)")
    args = parser.parse_args()
    if args.summary:
        print(f"wrote {summary()}")
        return 0
    if args.rescore:
        refuse_uncommitted(args.allow_dirty)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
        limit_threads(args.threads)
        print(f"wrote {rescore(args.rescore, args.work or WORK / args.rescore, args.shared)}")
        return 0
    if args.set:
        _check_overrides(parse_overrides(args.set), args.tag)
    if args.start_weights is not None and not args.tag:
        raise SystemExit("--start-weights makes an experiment: name it with --tag")
    dirty = refuse_uncommitted(args.allow_dirty)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    limit_threads(args.threads)
    runs = [(m, s) for m in args.minutes for s in (args.seed or [0])] if args.minutes else list(DEFAULT_RUNS)
    if args.seed and not args.minutes:
        runs = [(m, s) for m in sorted({m for m, _ in DEFAULT_RUNS}) for s in args.seed]
    for dataset in args.dataset or DATASETS:
        for minutes, seed in runs:
            print(f"wrote {run(dataset, minutes, seed, args, dirty)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
