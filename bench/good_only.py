"""A good-parts-only model fitted on defect-free images alone, scored on held-out defective and good images.

    python -m bench.good_only --minutes 2                      # -> bench/results/good_only_deeppcb_2min.json
    python -m bench.good_only --dataset agdd --minutes 2       # -> bench/results/good_only_agdd_2min.json
    python -m bench.good_only --dataset surface --minutes 2    # -> bench/results/good_only_surface_2min.json

Three protocols (`--dataset`):

DeepPCB (../shared/datasets/deeppcb) pairs every tested board image (with defects) with a defect-free template
of the same place. The model is fitted (`defectdet.anomaly.fit_good_only`, the `defectdet fit` command) on the
templates of the training board groups only, under a time budget; the split is the one `bench/realdata.py` and
`train` use (`data.formats.deeppcb`: the highest-numbered groups held out). On the held-out groups it is scored
through the torch-free runtime:

- image AUROC: the image score (the largest calibrated cell score) of each tested image (all defective) against
  each held-out template (all good), ties counted half; computed with NumPy;
- false-call rate: the share of held-out templates the bundle's own threshold flags (the threshold was chosen
  on held-out templates of the training groups at the target rate);
- escape rate: the share of tested images it does not flag;
- box AP@0.5, class-agnostic (COCO, pycocotools): every DeepPCB box as one class "defect", the bundle's boxes
  at a low score floor (`--ap-floor`) and at its threshold (the boxes an operator sees);
- model latency: the graph's run time per image at the bundle's input size, on this shared machine.

AGDD (../shared/datasets/agdd) has no defect-free image: every image holds boxes. Its good images are tiles
(`--tile` pixels square, a grid over each image at full resolution) of one lighting (`--lighting`) that no box
comes within `TILE_MARGIN` pixels of; a tile is defective where every box touching it has at least half its
area inside it (its boxes clipped to the tile); other tiles are left out. The model is fitted on the good tiles
of the training split (its threshold chosen on held-out good tiles of that split) and scored on the tiles of
the val split (other capture sessions). The tiles are written to a temporary folder, never into the repository.

The synthetic surface family (`defectdet.data.synth.generate_surface`, one material, gray, `--surface-size`
pixels square, seed `--seed`) renders every surface with and without its defects. The first
`1 - SURFACE_HELD_OUT` of `--surfaces` surfaces give their defect-free renders to fit on (threshold chosen on
held-out ones among them); the rest are scored: their renders with boxes as defective, their defect-free
renders as good (the way a DeepPCB template pairs its tested image).

Exits 0 without writing anything when ../shared is absent (DeepPCB, AGDD). A run from a tree with uncommitted code is refused
unless `--allow-dirty` (then the file lists it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import limit_threads, print_table, refuse_uncommitted, write_result

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
WORK = Path("runs/bench_good_only")
DATASETS = ("deeppcb", "agdd", "surface")
TILE_MARGIN = 8  # pixels: a good tile has no box this close to it
SURFACE_HELD_OUT = 0.3  # share of the synthetic surfaces scored (the rest fit the model)
PUBLISHED_CONTEXT = (
    "PatchCore (Roth et al., 2022) reports 0.99 image AUROC on MVTec AD, fitted on a GPU: other data, "
    "not comparable figure for figure"
)


def auroc(positives: np.ndarray, negatives: np.ndarray) -> float | None:
    """P(positive score > negative score) + half the ties: the area under the ROC curve."""
    positives, negatives = np.asarray(positives, np.float64), np.asarray(negatives, np.float64)
    if not len(positives) or not len(negatives):
        return None
    order = np.sort(negatives)
    below = np.searchsorted(order, positives, side="left")
    ties = np.searchsorted(order, positives, side="right") - below
    return float((below + 0.5 * ties).sum() / (len(positives) * len(negatives)))


def deeppcb_images(root: Path) -> dict[str, Any]:
    """Training groups' templates (to fit on), held-out groups' tested images with their boxes and templates."""
    from defectdet.data.formats import load_dataset

    train, held = load_dataset(root, "train").samples, load_dataset(root, "val").samples
    return {
        "fit": [sample.template_path for sample in train if sample.template_path is not None],
        "defective": [(sample.image_path, sample.boxes) for sample in held],
        "good": [sample.template_path for sample in held if sample.template_path is not None],
        "groups": {
            "fit": sorted({_group(sample) for sample in train}),
            "held_out": sorted({_group(sample) for sample in held}),
        },
        "dataset": "DeepPCB (trainval half): templates of the training board groups as the good images",
        "defective_text": "tested images of the held-out groups (every one has defects)",
        "good_text": "templates of the held-out groups",
    }


def tile_split(
    boxes: np.ndarray, width: int, height: int, tile: int, margin: int = TILE_MARGIN
) -> tuple[list[tuple[int, int]], list[tuple[tuple[int, int], np.ndarray]]]:
    """The grid of `tile`-pixel tiles over a `width` x `height` image with xyxy `boxes`: (good tiles' corners,
    defective tiles' corners with their boxes clipped and shifted into the tile). A tile is good where no box
    comes within `margin` pixels of it, defective where every box touching it has at least half its area
    inside it; any other tile is in neither list."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    area = np.maximum((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]), 1e-9)
    good, defective = [], []
    for y0 in range(0, height - tile + 1, tile):
        for x0 in range(0, width - tile + 1, tile):
            near = (
                (boxes[:, 2] > x0 - margin)
                & (boxes[:, 0] < x0 + tile + margin)
                & (boxes[:, 3] > y0 - margin)
                & (boxes[:, 1] < y0 + tile + margin)
            )
            if not near.any():
                good.append((x0, y0))
                continue
            clipped = np.clip(boxes, [x0, y0, x0, y0], [x0 + tile, y0 + tile, x0 + tile, y0 + tile])
            inside = np.maximum(clipped[:, 2] - clipped[:, 0], 0) * np.maximum(
                clipped[:, 3] - clipped[:, 1], 0
            )
            touching = inside > 0
            if touching.any() and (inside[near] >= 0.5 * area[near]).all():
                defective.append(((x0, y0), (clipped[touching] - [x0, y0, x0, y0]).astype(np.float32)))
    return good, defective


def _coco_boxes(path: Path, lighting: str) -> list[tuple[str, np.ndarray, int, int, str]]:
    """(file name, xyxy boxes, width, height, capture session) of each image of one lighting in a COCO file."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    boxes: dict[int, list[list[float]]] = {image["id"]: [] for image in doc["images"]}
    for annotation in doc["annotations"]:
        x, y, w, h = annotation["bbox"]
        boxes[annotation["image_id"]].append([x, y, x + w, y + h])
    return [
        (
            image["file_name"],
            np.array(boxes[image["id"]], np.float32).reshape(-1, 4),
            image["width"],
            image["height"],
            str(image.get("group", image["file_name"][:4])),
        )
        for image in doc["images"]
        if Path(image["file_name"]).stem.endswith(f"_{lighting}")
    ]


def agdd_images(root: Path, lighting: str, tile: int, folder: Path) -> dict[str, Any]:
    """Good tiles of the training split (to fit on); good and defective tiles of the val split, written as PNG
    files under `folder` (see `tile_split`)."""
    import cv2

    def cut(split: str) -> tuple[list[Path], list[tuple[Path, np.ndarray]], set[str]]:
        good, defective, sessions = [], [], set()
        (folder / split).mkdir(parents=True, exist_ok=True)
        for name, boxes, width, height, session in _coco_boxes(root / f"{split}.json", lighting):
            sessions.add(session)
            image = cv2.imread(str(root / "images" / name), cv2.IMREAD_UNCHANGED)
            clean, flawed = tile_split(boxes, width, height, tile)
            for (x0, y0), tile_boxes in [(corner, None) for corner in clean] + flawed:
                out = folder / split / f"{Path(name).stem}_{x0}_{y0}.png"
                cv2.imwrite(str(out), image[y0 : y0 + tile, x0 : x0 + tile])
                (good.append(out) if tile_boxes is None else defective.append((out, tile_boxes)))
        return good, defective, sessions

    fit, _, fit_sessions = cut("train")
    good, defective, held_sessions = cut("val")
    return {
        "fit": fit,
        "defective": defective,
        "good": good,
        "groups": {"fit": sorted(fit_sessions), "held_out": sorted(held_sessions)},
        "dataset": (
            f"AGDD, lighting {lighting}, {tile} x {tile} tiles: tiles of the train split that no box comes "
            f"within {TILE_MARGIN} px of as the good images"
        ),
        "defective_text": f"val-split tiles holding at least half of every box they touch ({lighting})",
        "good_text": f"val-split tiles no box comes within {TILE_MARGIN} px of ({lighting})",
    }


def surface_split(count: int, held_out: float = SURFACE_HELD_OUT) -> tuple[range, range]:
    """(fit, scored) surface indices: the first `1 - held_out` of `count` fit, the rest are scored."""
    scored = max(1, round(count * held_out))
    if count - scored < 2:
        raise SystemExit(f"--surfaces {count}: too few to fit on and score")
    return range(count - scored), range(count - scored, count)


def surface_images(seed: int, count: int, size: int, material: str, folder: Path) -> dict[str, Any]:
    """Defect-free renders of the fit surfaces; the scored surfaces' renders with boxes (defective) and their
    defect-free renders (good), written as PNG files under `folder`."""
    import cv2

    from defectdet.data.synth.surface import generate_surface

    fit_indices, scored = surface_split(count)
    fit, defective, good = [], [], []
    folder.mkdir(parents=True, exist_ok=True)
    for index in [*fit_indices, *scored]:
        surface = generate_surface(seed, index, size, size, color=False, materials=(material,), clean=True)
        clean = folder / f"clean_{index:04d}.png"
        cv2.imwrite(str(clean), surface.clean)
        if index in fit_indices:
            fit.append(clean)
            continue
        good.append(clean)
        if len(surface.boxes):
            cv2.imwrite(str(folder / f"defective_{index:04d}.png"), surface.image)
            defective.append((folder / f"defective_{index:04d}.png", surface.boxes))
    return {
        "fit": fit,
        "defective": defective,
        "good": good,
        "groups": {
            "fit": f"surfaces 0-{len(fit_indices) - 1}",
            "held_out": f"surfaces {scored[0]}-{scored[-1]}",
        },
        "dataset": (
            f"synthetic surfaces (generate_surface, seed {seed}, {material}, gray, {size} x {size}): defect-free "
            "renders of the fit surfaces as the good images"
        ),
        "defective_text": "renders of the scored surfaces that hold at least one defect",
        "good_text": "defect-free renders of the scored surfaces",
    }


def _group(sample: Any) -> str:
    from defectdet.data.formats.deeppcb import group_of

    return group_of(sample)


def score_images(
    bundle: Path, images: list[tuple[Path, np.ndarray | None]], ap_floor: float, tag: str
) -> dict[str, Any]:
    """Per image: the image score, the verdict at the bundle's threshold, ImageRecords at `ap_floor` and at the
    threshold, the graph's run time."""
    from defectdet.evaluation.types import ImageRecord
    from defectdet.runtime import pipeline
    from defectdet.runtime.predictor import Predictor

    predictor = Predictor(bundle)
    threshold = predictor.metadata.thresholds.threshold
    settings = predictor.spec.postprocess
    scores, model_ms = [], []
    records: dict[str, list[ImageRecord]] = {"floor": [], "threshold": []}
    for index, (path, boxes) in enumerate(images):
        prepared = predictor.prepare(predictor.load(path), None)
        started = time.perf_counter()
        predictions, _ = predictor.run(prepared.inputs)
        model_ms.append((time.perf_counter() - started) * 1e3)
        scores.append(float(predictions[0, :, 4].max()))
        truth = np.zeros((0, 4), np.float32) if boxes is None else boxes
        size = (prepared.transform.original_width, prepared.transform.original_height)
        for key, floor in (("floor", ap_floor), ("threshold", threshold)):
            found = pipeline.finish(predictions, prepared, dataclasses.replace(settings, score_floor=floor))
            records[key].append(
                ImageRecord(
                    f"{tag}{index}",
                    *size,
                    truth,
                    np.zeros(len(truth)),
                    found.boxes,
                    found.scores,
                    found.classes,
                )
            )
    return {"scores": np.array(scores), "records": records, "model_ms": model_ms, "threshold": threshold}


def box_ap50(records: list[Any]) -> float | None:
    from defectdet.evaluation.coco import coco_metrics

    return coco_metrics(records, ["defect"])["mAP50"]


def run(args: argparse.Namespace) -> Path | None:
    root = args.shared / args.dataset
    if args.dataset != "surface" and not root.is_dir():
        print(f"skipped: {root} is absent")
        return None
    refuse_uncommitted(args.allow_dirty)
    with tempfile.TemporaryDirectory(prefix="good_only_") as folder:
        return _run_on(args, _images(args, root, Path(folder)))


def _images(args: argparse.Namespace, root: Path, folder: Path) -> dict[str, Any]:
    if args.dataset == "agdd":
        return agdd_images(root, args.lighting, args.tile, folder)
    if args.dataset == "surface":
        return surface_images(args.seed, args.surfaces, args.surface_size, args.material, folder)
    return deeppcb_images(root)


def input_size_of(args: argparse.Namespace) -> int:
    """`--input-size`, else each protocol's native size: DeepPCB 640, an AGDD tile, a synthetic surface."""
    if args.input_size is not None:
        return args.input_size
    return {"agdd": args.tile, "surface": args.surface_size}.get(args.dataset, 640)


def _run_on(args: argparse.Namespace, data: dict[str, Any]) -> Path:
    from defectdet.anomaly import FitSettings, fit_good_only

    settings = FitSettings(
        minutes=args.minutes,
        input_size=input_size_of(args),
        false_call_rate=args.false_call_rate,
        seed=args.seed,
    )
    fitted = fit_good_only(data["fit"], args.work / "model.onnx", settings)
    if args.limit:  # a quick look: the first images of each kind only
        data["defective"], data["good"] = data["defective"][: args.limit], data["good"][: args.limit]
    defective = score_images(fitted.bundle, data["defective"], args.ap_floor, "tested")
    good = score_images(fitted.bundle, [(path, None) for path in data["good"]], args.ap_floor, "template")
    threshold = defective["threshold"]
    payload = _payload(args, data, fitted, defective, good, threshold)
    path = write_result(f"good_only_{args.dataset}_{args.minutes:g}min", payload)
    _print(payload)
    return path


def _payload(
    args: argparse.Namespace, data: dict, fitted: Any, defective: dict, good: dict, threshold: float
) -> dict[str, Any]:
    calibration = fitted.calibration
    latency = defective["model_ms"] + good["model_ms"]
    return {
        "dataset": data["dataset"],
        "dataset_key": args.dataset,
        "minutes": args.minutes,
        "seed": args.seed,
        "groups": data["groups"],
        "protocol": _protocol(args),
        "fit": {
            "images_available": len(data["fit"]),
            "fit_images": fitted.fit_images,
            "heldout_images": fitted.heldout_images,
            "memory_vectors": fitted.memory_vectors,
            "input_size": fitted.metadata.input_size,
            "timings_s": fitted.timings,
            "threshold_chosen_on": fitted.metadata.thresholds.threshold_source,
            "false_call_rate_target": calibration.target_rate,
            "heldout_false_call_rate_fit_groups": calibration.false_call_rate,
        },
        "evaluated_on": {
            "defective": f"{len(data['defective'])} {data['defective_text']}",
            "good": f"{len(data['good'])} {data['good_text']}",
        },
        "image_auroc": auroc(defective["scores"], good["scores"]),
        "threshold": threshold,
        "false_call_rate": float((good["scores"] >= threshold).mean()),
        "escape_rate": float((defective["scores"] < threshold).mean()),
        "box_AP50_class_agnostic": {
            f"score_floor_{args.ap_floor:g}": box_ap50(
                defective["records"]["floor"] + good["records"]["floor"]
            ),
            "at_threshold": box_ap50(defective["records"]["threshold"] + good["records"]["threshold"]),
        },
        "model_ms": {"p50": statistics.median(latency), "mean": statistics.fmean(latency)},
        "context": PUBLISHED_CONTEXT,
        "note": "a shared machine (other work ran beside it; see environment.machine.load_average)",
    }


def _protocol(args: argparse.Namespace) -> dict[str, Any]:
    """The settings that define the images of `args.dataset`'s protocol."""
    if args.dataset == "agdd":
        return {"lighting": args.lighting, "tile": args.tile, "tile_margin": TILE_MARGIN}
    if args.dataset == "surface":
        return {
            "surfaces": args.surfaces,
            "size": args.surface_size,
            "material": args.material,
            "held_out_share": SURFACE_HELD_OUT,
        }
    return {"split": "data.formats.deeppcb (highest-numbered groups held out)"}


def _print(payload: dict[str, Any]) -> None:
    ap = payload["box_AP50_class_agnostic"]
    rows = [
        ["image AUROC", payload["image_auroc"]],
        ["false-call rate (held-out groups)", payload["false_call_rate"]],
        ["escape rate (held-out groups)", payload["escape_rate"]],
        *[[f"box AP@0.5 ({key})", value] for key, value in ap.items()],
        [
            "fit images / memory vectors",
            f"{payload['fit']['fit_images']} / {payload['fit']['memory_vectors']}",
        ],
        ["model ms p50", payload["model_ms"]["p50"]],
    ]
    title = f"good parts only, {payload.get('dataset_key', 'deeppcb')}, {payload['minutes']:g} min"
    print_table(title, ["figure", "value"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=2.0, help="fitting time budget")
    parser.add_argument("--dataset", choices=DATASETS, default="deeppcb")
    parser.add_argument(
        "--input-size",
        type=int,
        default=None,
        help="default: DeepPCB 640, AGDD the tile, surfaces their size",
    )
    parser.add_argument("--lighting", default="L1", help="AGDD: the lighting used (L1 or L2)")
    parser.add_argument("--tile", type=int, default=160, help="AGDD: tile side in pixels")
    parser.add_argument("--surfaces", type=int, default=400, help="synthetic surfaces generated")
    parser.add_argument("--surface-size", type=int, default=320, help="synthetic surface side in pixels")
    parser.add_argument("--material", default="cast", help="synthetic surface material")
    parser.add_argument("--false-call-rate", type=float, default=0.01)
    parser.add_argument(
        "--ap-floor", type=float, default=0.05, help="score floor of the boxes AP is measured on"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads while fitting")
    parser.add_argument("--shared", type=Path, default=SHARED, help="the folder holding deeppcb/ and agdd/")
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--limit", type=int, default=None, help="score only this many images of each kind")
    parser.add_argument("--allow-dirty", action="store_true")
    args = parser.parse_args()
    limit_threads(args.threads)
    path = run(args)
    if path is not None:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
