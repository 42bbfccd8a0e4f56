"""What limits AGDD with one lighting: how visible each class is under each lighting, and how well a trained model
fits the images it trained on against held-out and val images.

    python -m bench.agdd_diagnose                                   # contrast only (seconds)
    python -m bench.agdd_diagnose --run runs/bench_realdata/realdata_agdd_1light_30min_seed0

Contrast: each image is read in gray and resized to the input size the defaults choose for AGDD (608). The
residual is |pixel - its 15 px median|, which keeps lines and dots and drops the slow shading. A box's contrast
is the mean of its brightest 1 % of residual pixels (its line, dot or dent), divided by the same figure over the
pixels of the image outside every box (the defect-free texture and noise of that very image). A ratio near 1:
nothing in the box stands out from the rest of the image; boxes under `FAINT` count as barely visible.

Fit (`--run`, a `bench/realdata.py` work folder of an agdd_1light run): its last checkpoint scored (COCO
mAP@0.5) on the images it trained on, on the trainer's held-out part and on AGDD's val.json. Writes
`bench/results/agdd_diagnosis.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import uncommitted_code, write_result

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
SIZE = 608  # the input size the defaults choose for AGDD's 640 px images
FAINT = 1.5
CLASSES = ("scratches", "contusion", "spot")


def box_ratios(gray: np.ndarray, boxes: list[list[float]], scale: float) -> list[float] | None:
    """Contrast ratio of each xywh box (see the module docstring); None when too little of the image is free."""
    import cv2

    residual = np.abs(gray.astype(np.float32) - cv2.medianBlur(gray, 15).astype(np.float32))
    inside = np.zeros(gray.shape, bool)
    scaled = [[int(v * scale) for v in box] for box in boxes]
    for x, y, w, h in scaled:
        inside[y : y + h, x : x + w] = True
    free = residual[~inside]
    if free.size < 2000:
        return None
    reference = max(_brightest(free), 0.5)
    return [
        _brightest(residual[y : y + h, x : x + w]) / reference
        for x, y, w, h in scaled
        if residual[y : y + h, x : x + w].size >= 20
    ]


def _brightest(values: np.ndarray) -> float:
    ordered = np.sort(values.ravel())
    return float(ordered[-max(5, int(0.01 * ordered.size)) :].mean())


def contrast(root: Path, split: str) -> dict[str, dict[str, Any]]:
    """lighting -> class -> boxes, median ratio, share of faint boxes, over the split's samples."""
    import cv2

    document = json.loads((root / f"{split}.json").read_text())
    names = {c["id"]: c["name"] for c in document["categories"]}
    boxes: dict[int, list[tuple[str, list[float]]]] = {}
    for annotation in document["annotations"]:
        boxes.setdefault(annotation["image_id"], []).append(
            (names[annotation["category_id"]], annotation["bbox"])
        )
    found: dict[str, dict[str, list[float]]] = {"L1": {}, "L2": {}}
    for record in document["images"]:
        if not record["file_name"].endswith("_L1.png") or record["id"] not in boxes:
            continue
        for lighting, ratios in found.items():
            path = root / "images" / record["file_name"].replace("_L1.png", f"_{lighting}.png")
            gray = cv2.resize(
                cv2.imread(str(path), cv2.IMREAD_GRAYSCALE), (SIZE, SIZE), interpolation=cv2.INTER_AREA
            )
            scale = SIZE / max(record["width"], record["height"])
            values = box_ratios(gray, [box for _, box in boxes[record["id"]]], scale)
            for (name, _), value in zip(boxes[record["id"]], values or [], strict=False):
                ratios.setdefault(name, []).append(value)
    return {
        lighting: {
            name: {
                "boxes": len(ratios[name]),
                "median_ratio": statistics.median(ratios[name]),
                "faint_share": sum(v < FAINT for v in ratios[name]) / len(ratios[name]),
            }
            for name in CLASSES
            if ratios.get(name)
        }
        for lighting, ratios in found.items()
    }


def fit(run: Path, threads: int) -> dict[str, dict[str, Any]]:
    """The run's last checkpoint on its trained images, its held-out part and val."""
    from defectdet.engine.validate import validate

    data = next((run / "data").iterdir())
    train = json.loads((data / "train.json").read_text())
    held = json.loads((data / "heldout" / "heldout.json").read_text())
    held_names = {r["file_name"] for r in held["images"]}
    images = [r for r in train["images"] if r["file_name"] not in held_names]
    ids = {r["id"] for r in images}
    trained = {
        **train,
        "images": images,
        "annotations": [a for a in train["annotations"] if a["image_id"] in ids],
    }
    trained_path = run / "diagnosis" / "trained.json"
    trained_path.parent.mkdir(parents=True, exist_ok=True)
    trained_path.write_text(json.dumps(trained))
    parts = {
        "trained": (trained_path, "train", "the images it trained on"),
        "heldout": (data / "heldout" / "heldout.json", "heldout", "the trainer's grouped held-out part"),
        "val": (data / "val.json", "val", "AGDD val.json (other capture sessions)"),
    }
    scores = {}
    for key, (path, split, what) in parts.items():
        out = run / "diagnosis" / key
        metrics = validate(
            run / "run" / "last.pt", path, split=split, protocol="coco", out=out, threads=threads
        )
        scores[key] = {
            "what": what,
            "images": metrics["num_images"],
            "mAP50": metrics["headline"]["mAP50"],
            "class_AP50": (metrics.get("coco") or {}).get("class_AP50"),
        }
    return scores


def reading(document: dict[str, Any]) -> list[str]:
    """The figures in plain words."""
    sentences = []
    faint = document["contrast"].get("val", {})
    if "scratches" in faint.get("L1", {}) and "scratches" in faint.get("L2", {}):
        one, two = faint["L1"]["scratches"], faint["L2"]["scratches"]
        sentences.append(
            f"Under the first lighting {100 * one['faint_share']:.0f} % of val's scratch boxes hold nothing that "
            f"stands out from the rest of the image (contrast ratio under {FAINT:g}), against "
            f"{100 * two['faint_share']:.0f} % under the second: the scratch boxes are drawn for both lightings, "
            "and many scratches show under the second lighting only."
        )
    scores = document.get("fit") or {}
    if scores:
        trained, val = scores["trained"], scores["val"]
        scratch = (trained.get("class_AP50") or {}).get("scratches")
        sentences.append(
            f"The model scores mAP@0.5 {trained['mAP50']:.3f} on the images it trained on and {val['mAP50']:.3f} on "
            f"val: it does not carry what it fits to other capture sessions (contusion and spot), and scratches "
            f"reach only {scratch:.3f} even on its own training images: it cannot fit what the image does not show."
        )
    return sentences


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shared", type=Path, default=SHARED, help="the folder holding agdd/")
    parser.add_argument("--run", type=Path, help="a bench/realdata.py work folder of an agdd_1light run")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if uncommitted_code():
        raise SystemExit("uncommitted code: commit it first")
    root = args.shared / "agdd"
    document: dict[str, Any] = {
        "command": " ".join(["python -m bench.agdd_diagnose", *sys.argv[1:]]),
        "input_size": SIZE,
        "faint_ratio": FAINT,
        "contrast": {split: contrast(root, split) for split in ("train", "val")},
    }
    if args.run:
        document["run"] = str(args.run)
        document["run_result"] = args.run.name  # the bench/realdata.py result file of that run
        document["fit"] = fit(args.run, args.threads)
    document["reading"] = reading(document)
    print(json.dumps({k: document[k] for k in ("contrast", "reading")}, indent=1))
    print(f"wrote {write_result('agdd_diagnosis', document)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
