"""What a bundle's false calls are: the boxes it draws on defect-free boards, by class, size and score, and the
share of defect-free boards it flags at a given escape rate.

    python -m bench.false_calls --bundle runs/bench_realdata/realdata_deeppcb_plain_10min_seed2/model.onnx \\
        --data ../shared/datasets/deeppcb --split val --name deeppcb_plain_10min_seed2

The defective boards are the split's images; the defect-free boards are its templates recaptured with the
nuisances `val --clean-templates` uses (same seed), so the figures match that run's. Each board's verdict is its
highest-scoring box. The escape-rate operating point is chosen on the same boards it is reported on (optimistic:
it says how far the scores separate, not what a threshold chosen elsewhere would do). Writes
`bench/results/false_calls_<name>.json` and, beside it, `false_calls_<name>.png`: the highest-scoring false boxes
on the defect-free boards, each cut out with its surroundings, and `false_calls_<name>_labelled.png`: labelled
defects of the class called most often, cut out the same way (the real-data page shows both).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import print_table, refuse_uncommitted, write_result

SCORE_FLOOR = 0.01
GRID = (4, 6)  # rows, columns of the picture of the highest-scoring false boxes
CELL_PX = 160  # each cell: 80 x 80 px of the board around the box's centre, enlarged 2x
ESCAPE_TARGETS = (0.0, 0.01, 0.02, 0.05)


def predictions(bundle: Path, images: list[Path]) -> list[list[Any]]:
    """Every box above `SCORE_FLOOR` per image, through the torch-free runtime (no template given)."""
    from defectdet.runtime.predictor import Predictor

    predictor = Predictor(bundle)
    return [
        list(predictor.predict(path.read_bytes(), score_floor=SCORE_FLOOR, threshold=SCORE_FLOOR).detections)
        for path in images
    ]


def top_scores(boards: list[list[Any]]) -> np.ndarray:
    return np.array([max((box.score for box in boxes), default=0.0) for boxes in boards])


def operating_points(defective: np.ndarray, clean: np.ndarray) -> list[dict[str, float]]:
    """Per target escape rate: the highest threshold whose escapes stay within it, and the false calls there."""
    points = []
    for target in ESCAPE_TARGETS:
        allowed = int(np.floor(target * len(defective)))
        threshold = float(np.sort(defective)[allowed]) if len(defective) else 1.0
        points.append(
            {
                "target_escape_rate": target,
                "threshold": threshold,
                "escape_rate": float(np.mean(defective < threshold)),
                "false_call_rate": float(np.mean(clean >= threshold)),
            }
        )
    return points


def false_boxes(clean: list[list[Any]], threshold: float) -> dict[str, Any]:
    """The boxes at or above `threshold` on defect-free boards: count per class, sizes and scores."""
    boxes = [box for board in clean for box in board if box.score >= threshold]
    sides = np.array([[box.box[2] - box.box[0], box.box[3] - box.box[1]] for box in boxes]).reshape(-1, 2)
    scores = np.array([box.score for box in boxes])
    quantiles = (10, 50, 90)
    return {
        "threshold": threshold,
        "boxes": len(boxes),
        "boards_flagged": int(sum(any(box.score >= threshold for box in board) for board in clean)),
        "per_class": dict(Counter(box.class_name for box in boxes).most_common()),
        "side_px_percentiles": {
            str(q): [float(v) for v in np.percentile(sides, q, axis=0)] if len(sides) else None
            for q in quantiles
        },
        "score_percentiles": {
            str(q): float(np.percentile(scores, q)) if len(scores) else None for q in quantiles
        },
    }


def crop_cell(path: Path, box: Any, label: str) -> np.ndarray:
    """80 x 80 px of the board around the box's centre (grey beyond its edges), enlarged to `CELL_PX`, labelled."""
    import cv2

    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    centre_x, centre_y = (int((box[0] + box[2]) / 2), int((box[1] + box[3]) / 2))
    padded = cv2.copyMakeBorder(image, 40, 40, 40, 40, cv2.BORDER_CONSTANT, value=(64, 64, 64))
    cell = cv2.resize(
        padded[centre_y : centre_y + 80, centre_x : centre_x + 80],
        (CELL_PX, CELL_PX),
        interpolation=cv2.INTER_NEAREST,
    )
    cv2.putText(cell, label, (3, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 255), 1)
    return cell


def write_grid(cells: list[np.ndarray], out: Path) -> Path:
    """`GRID` cells (blank where there are fewer) as one PNG."""
    import cv2

    blank = np.full((CELL_PX, CELL_PX, 3), 255, np.uint8)
    cells = cells[: GRID[0] * GRID[1]] + [blank] * (GRID[0] * GRID[1] - len(cells))
    rows = [np.hstack(cells[row * GRID[1] : (row + 1) * GRID[1]]) for row in range(GRID[0])]
    cv2.imwrite(str(out), np.vstack(rows))
    return out


def false_box_grid(clean: list[list[Any]], images: list[Path], threshold: float, out: Path) -> Path:
    """A PNG of the highest-scoring false boxes (one per board, best first), each with its class and score."""
    best = sorted(
        (
            (max(boxes, key=lambda box: box.score), path)
            for boxes, path in zip(clean, images, strict=True)
            if boxes
        ),
        key=lambda pair: -pair[0].score,
    )
    chosen = [pair for pair in best if pair[0].score >= threshold][: GRID[0] * GRID[1]]
    return write_grid(
        [crop_cell(path, box.box, f"{box.class_name} {box.score:.2f}") for box, path in chosen], out
    )


def labelled_grid(split: Any, class_name: str, out: Path) -> Path:
    """A PNG of labelled defects of `class_name` in the split (one per board, in file order), cut out as the
    false boxes are: what the model was taught that class looks like, beside what it calls it on clean boards."""
    class_id = split.class_names.index(class_name)
    chosen = []
    for sample in split.samples:
        boxes = [box for box, label in zip(sample.boxes, sample.classes, strict=True) if label == class_id]
        if boxes:
            chosen.append((sample.image_path, boxes[0]))
    return write_grid([crop_cell(path, box, f"label {class_name}") for path, box in chosen], out)


def run(args: argparse.Namespace, dirty: bool) -> Path:
    from defectdet.data.formats import load_dataset
    from defectdet.data.recapture import make_clean_boards
    from defectdet.data.recapture_config import RecaptureConfig
    from defectdet.runtime.bundle import read_metadata

    metadata = read_metadata(args.bundle)
    if metadata.template or metadata.companions:
        raise SystemExit(f"{args.bundle}: takes a template or companions; this benchmark scores images alone")
    split = load_dataset(args.data, args.split)
    clean_samples = make_clean_boards(
        split, args.work / "clean_boards", RecaptureConfig(), channels=metadata.channels, seed=args.seed
    )
    defective = predictions(args.bundle, [sample.image_path for sample in split.samples])
    clean = predictions(args.bundle, [sample.image_path for sample in clean_samples])
    templates = sorted({sample.template_path for sample in split.samples if sample.template_path is not None})
    as_they_are = top_scores(predictions(args.bundle, templates))
    bundle_threshold = float(metadata.thresholds.threshold)
    body = {
        "command": " ".join(["python -m bench.false_calls", *sys.argv[1:]]),
        "dirty": dirty,
        "bundle": str(args.bundle),
        "dataset": args.dataset,
        "data": str(args.data),
        "split": args.split,
        "defective_boards": len(defective),
        "clean_boards": len(clean),
        "recapture_seed": args.seed,
        "at_bundle_threshold": false_boxes(clean, bundle_threshold),
        # the same templates without the recapture nuisances: are the false calls the nuisances' doing?
        "templates_as_they_are": {
            "boards": len(as_they_are),
            "boards_flagged": int(np.sum(as_they_are >= bundle_threshold)),
        },
        "operating_points": operating_points(top_scores(defective), top_scores(clean)),
        "chosen_on": "the same boards it is reported on (optimistic)",
    }
    path = write_result(f"false_calls_{args.name}", body)
    clean_images = [sample.image_path for sample in clean_samples]
    false_box_grid(clean, clean_images, bundle_threshold, path.with_suffix(".png"))
    per_class = body["at_bundle_threshold"]["per_class"]
    if per_class:  # the class called most often, as the split's labels show it
        labelled_grid(split, next(iter(per_class)), path.with_name(f"{path.stem}_labelled.png"))
    rows = [
        [p["target_escape_rate"], f"{p['threshold']:.3f}", f"{p['false_call_rate']:.3f}"]
        for p in body["operating_points"]
    ]
    print_table(f"false_calls_{args.name}", ["escapes at most", "threshold", "false-call rate"], rows)
    print(body["at_bundle_threshold"]["per_class"])
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="a dataset whose split has templates")
    parser.add_argument("--split", default="val")
    parser.add_argument(
        "--dataset", default="deeppcb_plain", help="the real-data benchmark's name for the data"
    )
    parser.add_argument("--name", required=True, help="the result file is false_calls_<name>.json")
    parser.add_argument("--seed", type=int, default=0, help="the recapture seed (val's default: 0)")
    parser.add_argument("--work", type=Path, default=Path("runs/bench_false_calls"))
    parser.add_argument("--allow-dirty", action="store_true")
    args = parser.parse_args()
    run(args, refuse_uncommitted(args.allow_dirty))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
