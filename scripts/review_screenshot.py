"""Make the review page's screenshot for the documentation (docs/assets/screenshots/review-page.png, 1366x768).

    OMP_NUM_THREADS=1 python scripts/review_screenshot.py --work runs/review-screenshot \\
        --out docs/assets/screenshots/review-page.png

What it does, with the `defectdet` commands of the same environment: synthesizes boards, trains a detector for
about a minute and exports it; serves it with `--keep flagged,uncertain` and posts a few other boards with their
templates, as a line would; opens `defectdet review` on the kept folder in headless Chromium, types the
operator's name, accepts one image, opens the kept image with the most detections and corrects it as an
operator would (draws the defect the model missed, re-classes a detection of the wrong class), then saves the
page. A step whose output is already in the work folder is not run again (delete the folder to start over).
Needs playwright (the `dev` extra) and a Chromium binary (Debian: apt-get install chromium); nothing is fetched
from the network.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cv2
import httpx

SCREEN = {"width": 1366, "height": 768}
OPERATOR = "anna"
LINE_BOARDS = 8
Box = list[float]


def program() -> str:
    """The `defectdet` command beside this Python (the same environment), else the one on PATH."""
    beside = Path(sys.executable).with_name("defectdet")
    return str(beside) if beside.exists() else "defectdet"


def defectdet(*args: str | Path, cwd: Path) -> None:
    """Run one `defectdet` command in `cwd`, its output in cwd/defectdet.log; a failure stops the script."""
    command = [program(), *map(str, args)]
    with open(cwd / "defectdet.log", "a") as log:
        subprocess.run(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, check=True)


def train_bundle(work: Path) -> Path:
    """work/model.onnx: a detector trained for a minute on 40 synthetic boards (skipped when it is there)."""
    bundle = work / "model.onnx"
    if not bundle.exists():
        defectdet("synth", "data", "--boards", 40, "--seed", 3, "--max-size", 640, cwd=work)
        defectdet("train", "data/data.yaml", "--time", 1, "--out", "train", cwd=work)
        defectdet("export", "train/best.pt", "--out", bundle.name, cwd=work)
    return bundle


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def running(args: list[str | Path], ready: str, cwd: Path) -> Iterator[str]:
    """Start `defectdet ARGS --port P` in `cwd`, wait until GET `ready` answers 200, yield the base URL; stop it
    with Ctrl+C (a graceful shutdown: the keep queue is written out)."""
    port = free_port()
    log = open(cwd / "defectdet.log", "a")
    process = subprocess.Popen(
        [program(), *map(str, args), "--port", str(port)], cwd=cwd, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"defectdet {args[0]} did not start; see {cwd / 'defectdet.log'}")
            try:
                if httpx.get(url + ready, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(60)
        log.close()


def keep_line(bundle: Path, work: Path) -> Path:
    """work/served: what `serve --keep flagged,uncertain` kept of 8 other boards posted with their templates
    (uploaded as line3-0000.png, ...: the board's index in `board_images`). Skipped when the folder is there."""
    kept = work / "served"
    if kept.exists():
        return kept
    defectdet("synth", "line", "--boards", LINE_BOARDS, "--seed", 11, "--max-size", 640, cwd=work)
    args: list[str | Path] = ["serve", bundle.name, "--keep", "flagged,uncertain", "--keep-dir", kept.name]
    with running(args, "/readyz", work) as url:
        for index, image in enumerate(board_images(work)):
            files = {
                "image": (f"line3-{index:04d}.png", image.read_bytes(), "image/png"),
                "template": (image.name, template_of(image).read_bytes(), "image/png"),
            }
            httpx.post(url + "/v1/detect", files=files, timeout=60).raise_for_status()
    return kept


def board_images(work: Path) -> list[Path]:
    """The line's boards (work/line, from `defectdet synth`), in the order they were posted."""
    return sorted((work / "line" / "images").glob("*/*.png"))


def template_of(image: Path) -> Path:
    """images/SPLIT/NAME.png -> templates/SPLIT/NAME.png."""
    return image.parents[2] / "templates" / image.parent.name / image.name


def true_boxes(image: Path) -> list[tuple[int, Box]]:
    """The synthetic board's defects as (class id, [x1, y1, x2, y2] in pixels), from its YOLO label file."""
    height, width = cv2.imread(str(image), cv2.IMREAD_UNCHANGED).shape[:2]
    label = image.parents[2] / "labels" / image.parent.name / f"{image.stem}.txt"
    boxes = []
    for line in label.read_text().splitlines():
        class_id, cx, cy, w, h = (float(value) for value in line.split())
        box = [(cx - w / 2) * width, (cy - h / 2) * height, (cx + w / 2) * width, (cy + h / 2) * height]
        boxes.append((int(class_id), box))
    return boxes


def iou(a: Box, b: Box) -> float:
    """Intersection over union of two [x1, y1, x2, y2] boxes."""
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def plan_edits(kept: Path, work: Path) -> dict[str, Any]:
    """The kept image to show and its corrections: `miss`, a true defect no shown detection found (class, box),
    and `wrong`, a shown detection of the wrong class (its box, the true class). The image with a miss, a wrong
    class and the most shown detections wins."""
    boards = board_images(work)
    plans = []
    for sidecar_path in sorted((kept / "predictions").glob("*.json")):
        sidecar = json.loads(sidecar_path.read_text())
        truth = true_boxes(boards[int(Path(sidecar["upload_name"]).stem.split("-")[1])])
        shown = [d for d in sidecar["detections"] if d["score"] >= sidecar["threshold"]]
        misses = [(c, box) for c, box in truth if all(iou(box, d["box"]) < 0.3 for d in shown)]
        wrong = [
            (d["box"], c)
            for d in shown
            for c, box in truth
            if iou(box, d["box"]) >= 0.5 and c != d["class_id"]
        ]
        name = next((kept / "images").glob(f"{sidecar_path.stem}.*")).name
        plan = {"name": name, "miss": misses[:1], "wrong": wrong[:1], "shown": len(shown)}
        plans.append(plan)
    best = max(plans, key=lambda plan: (bool(plan["miss"]), bool(plan["wrong"]), plan["shown"]))
    if not (best["miss"] or best["wrong"]):
        raise SystemExit("the model found every defect with its class: nothing to correct on the page")
    return best


def image_point(page: Any, x: float, y: float) -> tuple[float, float]:
    """Image pixel (x, y) -> page coordinates, through the page's current zoom and pan."""
    view = json.loads(page.get_attribute("#canvas", "data-view"))
    rect = page.locator("#canvas").bounding_box()
    return rect["x"] + x * view["s"] + view["tx"], rect["y"] + y * view["s"] + view["ty"]


def saved(page: Any) -> int:
    """How many decisions the page saved so far."""
    return int(page.get_attribute("body", "data-saved") or 0)


def wait_saved(page: Any, count: int) -> None:
    """Wait until the page saved `count` decisions and takes keys again."""
    page.wait_for_function(
        f"() => Number(document.body.dataset.saved || 0) >= {count} && !document.body.dataset.busy"
    )


def open_item(page: Any, name: str) -> None:
    """Click `name` in the list and wait until its image is shown."""
    page.click(f"#items li:has-text('{name}')")
    page.wait_for_function(
        f"() => document.getElementById('item-name').textContent === {name!r}"
        " && document.getElementById('canvas').dataset.size !== undefined"
    )


def correct(page: Any, plan: dict[str, Any]) -> None:
    """Draw the missed defect with its class key, then select the wrong-class detection in the box table and
    press its true class's key; it stays selected."""
    for class_id, box in plan["miss"]:
        count = saved(page)
        page.keyboard.press(str(class_id + 1))
        page.mouse.move(*image_point(page, box[0] - 3, box[1] - 3))
        page.mouse.down()
        page.mouse.move(*image_point(page, box[2] + 3, box[3] + 3), steps=8)
        page.mouse.up()
        wait_saved(page, count + 1)
    boxes = page.evaluate("() => state.boxes.map((b) => b.box)")
    for box, class_id in plan["wrong"]:
        index = max(range(len(boxes)), key=lambda i: iou(boxes[i], box))
        count = saved(page)
        page.click(f"#boxes tr[data-index='{index}']")
        page.keyboard.press(str(class_id + 1))
        wait_saved(page, count + 1)


def local_only(route: Any) -> None:
    """Let the page reach the review server only."""
    if route.request.url.startswith("http://127.0.0.1:"):
        route.continue_()
    else:
        route.abort()


def screenshot(review_url: str, plan: dict[str, Any], out: Path) -> None:
    """Open the page, type the operator's name, accept another image, correct the planned one, save a PNG."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport=SCREEN)
            page.route("http*://**", local_only)
            page.goto(review_url + "/review")
            page.wait_for_function("() => document.getElementById('canvas').dataset.size !== undefined")
            page.fill("#operator", OPERATOR)
            page.keyboard.press("Enter")
            names = page.locator("#items li .name").all_text_contents()
            open_item(page, next(name for name in names if name != plan["name"]))
            page.keyboard.press("a")  # accepted as the model saw it
            wait_saved(page, 1)
            open_item(page, plan["name"])
            correct(page, plan)
            page.mouse.move(0, SCREEN["height"] - 1)  # no hover tooltip in the picture
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out))
        finally:
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=Path("runs/review-screenshot"), help="scratch folder")
    parser.add_argument("--out", type=Path, default=Path("docs/assets/screenshots/review-page.png"))
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    kept = keep_line(train_bundle(work), work)
    plan = plan_edits(kept, work)
    print(f"showing {plan['name']}: {plan['shown']} detections, corrections {plan['miss']} {plan['wrong']}")
    shutil.rmtree(work / "kept", ignore_errors=True)  # a fresh copy: no decisions of an earlier run
    shutil.copytree(kept, work / "kept")
    with running(["review", "kept"], "/v1/review/items", work) as url:
        screenshot(url, plan, args.out)
    print(args.out)


if __name__ == "__main__":
    main()
