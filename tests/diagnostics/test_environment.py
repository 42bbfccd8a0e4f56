import dataclasses
import os

import torch

from defectdet.diagnostics import environment_report
from defectdet.diagnostics.environment import _resource_findings, _thread_findings


def test_environment_report_reads_this_machine():
    report = environment_report(speed_seconds=0.3)
    assert report.versions["torch"] == torch.__version__
    assert report.torch_threads == torch.get_num_threads()
    assert report.cpu.usable_cpus == len(os.sched_getaffinity(0))
    assert report.cpu.physical_cores >= 1
    assert (
        report.speed is not None
        and report.speed.matmul_gflops > 0
        and report.speed.conv_images_per_second > 0
    )
    assert report.shm_total_bytes == os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize


def test_oversubscription_and_small_shm_are_diagnosed(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "64")
    report = environment_report(speed_seconds=0)
    assert report.speed is None
    messages = [f.message for f in report.findings if f.severity == "warning" and f.topic == "threads"]
    assert any("OMP_NUM_THREADS=64" in message for message in messages)

    oversubscribed = dataclasses.replace(
        report, thread_variables={}, torch_threads=report.cpu.usable_cpus * 4
    )
    assert any(
        f.severity == "warning" and "threads on" in f.message for f in _thread_findings(oversubscribed)
    )

    docker_default = dataclasses.replace(report, shm_total_bytes=64 << 20)
    shm = [f for f in _resource_findings(docker_default) if f.topic == "shm"]
    assert shm and "64.0 MiB" in shm[0].message and "--shm-size" in shm[0].advice
    assert not [
        f
        for f in _resource_findings(dataclasses.replace(report, shm_total_bytes=8 << 30))
        if f.topic == "shm"
    ]
