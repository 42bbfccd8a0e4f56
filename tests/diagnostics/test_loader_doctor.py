import dataclasses
import os
import signal
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from defectdet.diagnostics import loader_report, scan_samples
from defectdet.diagnostics.doctor_settings import LoaderDoctorSettings
from defectdet.diagnostics.loader_doctor import _memory_findings


class Boards(Dataset):
    """Twelve 2x32x32 samples with a file name each; `odd` is 2x40x32; `broken` maps index -> failure."""

    def __init__(self, odd=None, broken=None, own_generator=False):
        self.odd, self.broken = odd, broken or {}
        self.rng = np.random.default_rng(0) if own_generator else None

    def __len__(self):
        return 12

    def __getitem__(self, index):
        failure = self.broken.get(index)
        if failure == "raise":
            raise ValueError(f"label of board {index} has 6 columns")
        if failure == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        if failure == "hang":
            time.sleep(60)
        value = float(self.rng.random()) if self.rng is not None else float(index)
        height = 40 if index == self.odd else 32
        return torch.full((2, height, 32), value), {"image_path": f"boards/{index:03d}.png"}


def test_odd_sized_sample_is_named_with_its_file_and_shapes():
    report = loader_report(
        Boards(odd=5),
        LoaderDoctorSettings(
            batch_size=4,
            workers=[0],
            seconds_per_setting=0.2,
            batches_per_setting=2,
            sample_timeout=10,
            explore=False,
        ),
    )
    shape = next(p for p in report.scan.problems if p.kind == "shape")
    assert (shape.index, shape.file) == (5, "boards/005.png")
    assert (
        "tensor[2, 40, 32]" in shape.message and "11 other sample(s) give (tensor[2, 32, 32]" in shape.message
    )
    collate = next(p for p in report.scan.problems if p.kind == "collate")
    assert (
        collate.indices == [4, 5, 6, 7]
        and collate.index == 5
        and "stack expects each tensor" in collate.message
    )
    errors = [f.message for f in report.findings if f.severity == "error"]
    assert any(message.startswith("sample 5 (boards/005.png)") for message in errors)
    # the timing runs on the other samples: it works and names a best setting
    assert report.best is not None and report.best.images_per_second > 0 and not report.best.error


def test_scan_names_a_sample_that_raises_one_that_kills_its_worker_and_one_that_hangs():
    dataset = Boards(broken={2: "raise", 6: "segfault", 9: "hang"})
    # the hanging sample sleeps 60 s; the others must answer within the timeout even on a loaded machine
    result = scan_samples(
        dataset, batch_size=4, collate_fn=torch.utils.data.default_collate, sample_timeout=10
    )
    problems = {problem.index: problem for problem in result.problems}
    assert sorted(problems) == [2, 6, 9]
    assert problems[2].kind == "error" and "label of board 2 has 6 columns" in problems[2].message
    assert problems[6].kind == "died" and problems[6].message.startswith("SIGSEGV")
    assert "test_loader_doctor.py" in problems[6].message and "in __getitem__" in problems[6].message  # where
    assert problems[9].kind == "hang" and "no result after 10 s" in problems[9].message
    assert result.scanned == 9  # every other sample was still read, after each failure


def test_identical_augmentations_across_workers_are_detected():
    def reseed(worker_id):
        info = torch.utils.data.get_worker_info()
        info.dataset.rng = np.random.default_rng(torch.initial_seed() % 2**32)

    options = LoaderDoctorSettings(
        batch_size=4, workers=[0], seconds_per_setting=0.1, batches_per_setting=1, scan_limit=0
    )
    broken = loader_report(Boards(own_generator=True), options, worker_init_fn=None)
    assert broken.seeding.status == "identical"
    finding = next(f for f in broken.findings if f.topic == "seeding")
    assert finding.severity == "error" and "worker_init_fn" in finding.advice
    assert loader_report(Boards(own_generator=True), options, worker_init_fn=reseed).seeding.status == "ok"
    assert loader_report(Boards(), options, worker_init_fn=None).seeding.status == "deterministic"


def test_model_step_bottleneck_and_shared_memory_estimate():
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.Flatten(), nn.LazyLinear(1))
    model(torch.zeros(1, 2, 32, 32))

    def as_model_batch(items):
        return torch.stack([item[0] for item in items])

    report = loader_report(
        Boards(),
        LoaderDoctorSettings(
            batch_size=4,
            workers=[0, 1],
            seconds_per_setting=0.2,
            batches_per_setting=2,
            scan_limit=0,
            model_seconds=0.5,
            explore=False,
        ),
        collate_fn=as_model_batch,
        model=model,
    )
    assert [s.workers for s in report.settings[:2]] == [0, 1]
    assert report.settings[1].persistent_workers and report.settings[1].restart_seconds is not None
    assert report.model_step is not None and report.model_step.images_per_second > 0
    assert any(f.topic == "bottleneck" for f in report.findings)
    assert report.batch_bytes == 4 * 2 * 32 * 32 * 4
    one_worker = dataclasses.replace(report, best=report.settings[1], shm_free_bytes=1024)
    (shm,) = _memory_findings(one_worker)
    assert shm.severity == "error" and "bus error" in shm.message and "--shm-size" in shm.advice


def test_loader_report_on_a_dataset_folder_names_a_truncated_image(tmp_path):
    from defectdet.data.synth import synthesize_dataset

    data = synthesize_dataset(tmp_path / "synth", boards=4, seed=0, min_size=96, max_size=128)
    broken = sorted((tmp_path / "synth" / "images" / "train").iterdir())[1]
    broken.write_bytes(broken.read_bytes()[:200])  # a truncated PNG
    report = loader_report(
        data,
        LoaderDoctorSettings(
            preset="nano",
            batch_size=2,
            workers=[0],
            seconds_per_setting=0.2,
            batches_per_setting=1,
            overrides={"input_size": 64, "crop_size": None},
            time_model=False,
        ),
    )
    assert report.scan.scanned == report.samples > 1
    (problem,) = report.scan.problems
    assert (problem.kind, problem.index, problem.file) == ("unreadable", 1, str(broken))
    assert "cannot decode image" in problem.message  # the reason the dataset logged, from the worker process
    assert report.best is not None and report.best.images_per_second > 0 and report.model_step is None
    assert report.seeding.status == "ok"  # DetectionDataset reseeds per worker through seed_worker


def test_a_model_that_does_not_fit_the_batch_is_reported_not_raised():
    report = loader_report(
        Boards(),
        LoaderDoctorSettings(
            batch_size=4,
            workers=[0],
            seconds_per_setting=0.1,
            batches_per_setting=1,
            scan_limit=0,
            explore=False,
        ),
        collate_fn=lambda items: torch.stack([item[0] for item in items]),
        model=nn.Linear(3, 1),
    )
    assert report.model_step is None
    failure = next(f for f in report.findings if f.topic == "model")
    assert failure.severity == "error" and "RuntimeError" in failure.message
