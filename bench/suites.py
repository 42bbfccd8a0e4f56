"""Every benchmark as one command: the named suites `python -m bench run --suite NAME` runs, and the benchmarks
that take an input only their user has (a checkpoint, a GPU, a second environment), each with its command.

Minutes are rough, for the 2-core cloud machines the result files were measured on. DeepPCB is read from
../shared/datasets/deeppcb unless a step says otherwise; the suites marked so need it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """One command, run from the repository root as `python -m MODULE ARGS`."""

    module: str  # `bench.latency`, or `defectdet.cli` for a product command between benchmarks
    args: tuple[str, ...] = ()
    minutes: float = 1.0

    @property
    def command(self) -> str:
        return " ".join(["python", "-m", self.module, *self.args])


@dataclass(frozen=True)
class Suite:
    name: str
    about: str
    steps: tuple[Step, ...]
    results_dir: str | None = None  # where its result files go when not bench/results/ (a smoke run)

    @property
    def minutes(self) -> float:
        return sum(step.minutes for step in self.steps)


DEEPPCB_MODEL = (
    Step("bench.train_deeppcb", (), 25),
    Step(
        "defectdet.cli", ("export", "runs/bench_deeppcb/best.pt", "--out", "runs/bench_deeppcb/model.onnx"), 1
    ),
)
BUNDLE = ("--bundle", "runs/bench_deeppcb/model.onnx")

SUITES = {
    suite.name: suite
    for suite in (
        Suite(
            "quick",
            "a smoke run of the training-speed benchmarks on synthetic data, no dataset; results go to "
            "runs/bench_quick/results, not bench/results/; then the pages checked against the committed files",
            (
                Step("bench.step_speed", ("--threads", "1", "--rounds", "1"), 1),
                Step("bench.amp_cpu", ("--steps", "5"), 0.5),
                Step("bench.host_memory", ("--steps", "5", "--repeats", "1"), 1),
                Step("bench.loader", ("--synthetic",), 1.5),
                Step("bench.pages", ("--check",), 0.2),
            ),
            results_dir="runs/bench_quick/results",
        ),
        Suite(
            "accuracy",
            "time to accuracy on DeepPCB and on synthetic surfaces, tiles, the demo and synthetic-to-real (DeepPCB)",
            (
                DEEPPCB_MODEL[0],
                Step("bench.train_surface", (), 15),
                Step("bench.tiles", (), 5),
                Step("bench.demo", ("--out", "runs/demo_check"), 10),
                Step("bench.synth_to_deeppcb", ("--checkpoint", "runs/demo_check/run/best.pt"), 5),
                Step("bench.good_only", ("--minutes", "2"), 6),
            ),
        ),
        Suite(
            "ladder",
            "the budget ladder (every rung without a result file yet), shipped weights against random ones, "
            "the real datasets and the presets on data no benchmark tuned them on (DeepPCB, ../shared/datasets)",
            (
                Step("bench.scaling", ("--all",), 480),
                Step("bench.pretrained", ("--summary",), 0.2),
                Step("bench.realdata", (), 300),
                Step("bench.realdata", ("--summary",), 0.2),
                Step("bench.frozen_features", ("--dataset", "agdd_1light", "--minutes", "10"), 12),
                Step("bench.frozen_features", ("--dataset", "deeppcb_plain", "--minutes", "10"), 14),
                Step("bench.preset_modes", ("--all", "--minutes", "5", "--threads", "1"), 60),
                Step("bench.preset_modes", ("--summary", "--minutes", "5"), 0.2),
            ),
        ),
        Suite(
            "inference",
            "latency per preset and per runtime, int8 against fp32 (DeepPCB)",
            (
                *DEEPPCB_MODEL,
                Step("bench.latency", (), 15),
                Step("bench.int8", ("--checkpoint", "runs/bench_deeppcb/best.pt"), 10),
            ),
        ),
        Suite(
            "service",
            "the drift monitor, load, abuse and the service's own cost against the in-process predictor (DeepPCB)",
            (
                *DEEPPCB_MODEL,
                Step("bench.drift", BUNDLE, 10),
                Step("bench.serve_load", BUNDLE, 10),
                Step("bench.serve_abuse", (), 10),
                Step("bench.serve_overhead", (), 5),
            ),
        ),
        Suite(
            "standard",
            "what `make bench` runs: the loader, latency, a DeepPCB model and its bundle, int8, drift, load, abuse, "
            "surfaces, tiles, the demo and synthetic-to-real (DeepPCB)",
            (
                Step("bench.loader", (), 5),
                Step("bench.latency", (), 15),
                *DEEPPCB_MODEL,
                Step("bench.int8", ("--checkpoint", "runs/bench_deeppcb/best.pt"), 10),
                Step("bench.drift", BUNDLE, 10),
                Step("bench.serve_load", BUNDLE, 10),
                Step("bench.serve_abuse", (), 10),
                Step("bench.train_surface", (), 15),
                Step("bench.tiles", (), 5),
                Step("bench.demo", ("--out", "runs/demo_check"), 10),
                Step("bench.synth_to_deeppcb", ("--checkpoint", "runs/demo_check/run/best.pt"), 5),
            ),
        ),
        Suite(
            "peers",
            "Ultralytics YOLO beside ours: the default ladder rungs, the curves, latency at matched sizes "
            "(needs .venv-peers: `make bench-peers` installs it and runs this list)",
            (
                *(
                    Step(
                        "bench.peers_ladder",
                        ("--rung", rung, "--threads", "1"),
                        float(rung.rsplit(":", 1)[1]) + 5,
                    )
                    for rung in (
                        "surface:yolo11n:352:10",
                        "surface:yolov8n:352:10",
                        "surface:yolo11n:640:10",
                        "deeppcb_plain:yolo11n:640:10",
                        "deeppcb_plain:yolo11n:320:10",
                        "deeppcb_template:yolo11n:320:10",
                        "surface:yolo11n:352:30",
                        "deeppcb_plain:yolo11n:640:30",
                        "surface:yolo11n:352:60",
                        "deeppcb_plain:yolo11n:640:60",
                    )
                ),
                Step("bench.peers_ladder", ("--summary",), 0.5),
                Step("bench.peers_latency", ("--threads", "1"), 15),
            ),
        ),
    )
}

# Benchmarks no suite runs: each needs an input of its user's, a GPU or a long one-off; the command runs one.
ON_REQUEST = {
    "ablate": "python -m bench.ablate --rung deeppcb_plain:tiny:20 --set synthetic_boards=0 --threads 1",
    "agdd_diagnose": "python -m bench.agdd_diagnose",
    "clean_boards": "python -m bench.clean_boards --checkpoint runs/deeppcb_nano/best.pt",
    "flip_views": "python -m bench.flip_views RUN/last.pt --data DATA",
    "gpu": "python -m bench.gpu --part deeppcb_template --minutes 1   # on a CUDA machine",
    "loop_shift": "python -m bench.loop_shift --threads 1",
    "new_design": "python -m bench.new_design --arm control --minutes 10 --threads 1",
    "pair_jitter_finetune": "python -m bench.pair_jitter_finetune --checkpoint runs/deeppcb_nano/best.pt",
    "peers": "python -m bench.peers --minutes 1 --name peers_smoke   # needs .venv-peers (make bench-peers)",
    "peers_surface": "python -m bench.peers_surface --minutes 10   # needs .venv-peers (make bench-peers)",
    "pretrain": "make pretrain   # the starting weights the package ships",
    "registration": "python -m bench.registration",
    "false_calls": "python -m bench.false_calls --bundle MODEL.onnx --data DATA --name NAME",
    "distill": "python -m bench.distill --steps 2000 --batch 16 --crop 256 --threads 1   # about 35 min",
    "repeat_check": "python -m bench.repeat_check RUN/last.pt --data DATA",
    "template_oracle": "python -m bench.template_oracle RUN/last.pt",
    "template_probe": "python -m bench.template_probe CHECKPOINT",
}

# Modules of the package that are not benchmarks: shared code, the page builder's parts, a child process.
NOT_BENCHMARKS = (
    "__init__",
    "__main__",
    "common",
    "migrate_results_v1",
    "pages_realdata",
    "peers_yolo",
    "result_schema",
    "serve_abuse_line",
    "suites",
)
