"""`environment_report()`: versions, CPU and threads, GPU, ONNX Runtime, disk, shared memory, a speed check.

Works without torch (the runtime-only install): the torch rows then say it is missing.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
import platform
import shutil
import time
from pathlib import Path
from typing import Any

from defectdet.diagnostics.report import Finding, format_bytes

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
CPU_FLAGS = {  # what we report -> /proc/cpuinfo flags that provide it
    "AVX2": ("avx2",),
    "AVX512": ("avx512f",),
    "VNNI": ("avx512_vnni", "avx_vnni"),
    "AVX512-BF16": ("avx512_bf16",),
    "AMX": ("amx_tile",),
}
SHM_WARN_BYTES = 1 << 30  # Docker's default 64 MiB /dev/shm kills DataLoader workers; below 1 GiB is risky


@dataclasses.dataclass
class CpuInfo:
    model: str
    flags: dict[str, bool]
    logical_cpus: int
    physical_cores: int
    usable_cpus: int  # sched affinity
    cgroup_cpus: float | None  # CPU quota of the container, None when unlimited
    load_average: float | None


@dataclasses.dataclass
class SpeedCheck:
    seconds: float
    threads: int
    matmul_gflops: float
    matmul_gflops_one_thread: float
    conv_images_per_second: float


@dataclasses.dataclass
class EnvironmentReport:
    versions: dict[str, str | None]
    cpu: CpuInfo
    torch_threads: int | None
    torch_interop_threads: int | None
    torch_cpu_capability: str | None
    thread_variables: dict[str, str]
    gpus: list[dict[str, Any]]
    onnxruntime_providers: list[str]
    disk_free_bytes: int
    disk_path: str
    shm_total_bytes: int | None
    shm_free_bytes: int | None
    speed: SpeedCheck | None
    findings: list[Finding]


def _version(distribution: str, module: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        try:
            return str(getattr(importlib.import_module(module), "__version__", "installed"))
        except ImportError:
            return None


def package_versions() -> dict[str, str | None]:
    """Versions of the packages defectdet depends on (None: not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name, distribution, module in (
        ("defectdet", "defectdet", "defectdet"),
        ("torch", "torch", "torch"),
        ("onnxruntime", "onnxruntime", "onnxruntime"),
        ("opencv", "opencv-python-headless", "cv2"),
        ("numpy", "numpy", "numpy"),
    ):
        versions[name] = _version(distribution, module)
    if versions["opencv"] is None:
        versions["opencv"] = _version("opencv-python", "cv2")
    return versions


def _cpuinfo_text() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


def _cgroup_cpus() -> float | None:
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def cpu_info() -> CpuInfo:
    """CPU model, the instruction-set flags that matter for inference, and how many cores we may use."""
    text = _cpuinfo_text()
    model, flags, cores = platform.processor() or platform.machine(), set(), set()
    physical_id = core_id = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name":
            model = value
        elif key == "flags":
            flags.update(value.split())
        elif key == "physical id":
            physical_id = value
        elif key == "core id":
            core_id = value
            cores.add((physical_id, core_id))
    logical = os.cpu_count() or 1
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = logical
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return CpuInfo(
        model=model,
        flags={name: any(flag in flags for flag in names) for name, names in CPU_FLAGS.items()},
        logical_cpus=logical,
        physical_cores=len(cores) or logical,
        usable_cpus=usable,
        cgroup_cpus=_cgroup_cpus(),
        load_average=load,
    )


def _gpus(torch: Any) -> list[dict[str, Any]]:
    if torch is None or not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        gpus.append(
            {
                "index": index,
                "name": properties.name,
                "memory_bytes": int(properties.total_memory),
                "capability": f"{properties.major}.{properties.minor}",
                "cuda": torch.version.cuda,
                "bf16": bool(torch.cuda.is_bf16_supported()),
            }
        )
    return gpus


def _best_rate(work: Any, seconds: float) -> float:
    """Best calls per second of `work()` over about `seconds` (best-of, so other load matters less)."""
    work()  # warm-up: allocations, kernel selection
    best, deadline = 0.0, time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        work()
        elapsed = time.perf_counter() - start
        best = max(best, 1.0 / max(elapsed, 1e-9))
        if time.perf_counter() >= deadline:
            return best


def speed_check(seconds: float = 5.0) -> SpeedCheck:
    """fp32 matmul GFLOP/s (all threads and one thread) and conv images/s, in about `seconds` in total."""
    import torch

    threads = torch.get_num_threads()
    size = 512
    left, right = torch.randn(size, size), torch.randn(size, size)
    flops = 2 * size**3
    conv = torch.nn.Conv2d(32, 32, 3, padding=1).eval()
    images = torch.randn(1, 32, 112, 112)

    def convolve() -> None:
        with torch.inference_mode():
            conv(images)

    matmul_rate = _best_rate(lambda: torch.mm(left, right), seconds * 0.4)
    try:
        torch.set_num_threads(1)
        one_thread_rate = _best_rate(lambda: torch.mm(left, right), seconds * 0.2)
    finally:
        torch.set_num_threads(threads)
    conv_rate = _best_rate(convolve, seconds * 0.4)
    return SpeedCheck(
        seconds=seconds,
        threads=threads,
        matmul_gflops=matmul_rate * flops / 1e9,
        matmul_gflops_one_thread=one_thread_rate * flops / 1e9,
        conv_images_per_second=conv_rate,
    )


def _thread_findings(report: EnvironmentReport) -> list[Finding]:
    cpu, findings = report.cpu, []
    budget = min(cpu.usable_cpus, cpu.physical_cores)
    if cpu.cgroup_cpus is not None:
        budget = min(budget, max(1, int(cpu.cgroup_cpus)))
    for name, value in report.thread_variables.items():
        if value.isdigit() and int(value) > budget:
            findings.append(
                Finding(
                    "warning",
                    "threads",
                    f"{name}={value} but only {budget} core(s) are usable: threads oversubscribe",
                    f"export {name}={budget} (or unset it)",
                )
            )
    threads = report.torch_threads
    if threads is not None and threads > budget:
        findings.append(
            Finding(
                "warning",
                "threads",
                f"torch uses {threads} threads on {budget} usable core(s)"
                + (f" (container quota {cpu.cgroup_cpus:g} CPUs)" if cpu.cgroup_cpus else ""),
                f"torch.set_num_threads({budget}) or OMP_NUM_THREADS={budget}: extra threads only contend",
            )
        )
    elif threads is not None:
        findings.append(
            Finding("ok", "threads", f"torch uses {threads} thread(s) on {budget} usable core(s)")
        )
    if cpu.load_average is not None and cpu.load_average > 0.75 * cpu.usable_cpus:
        findings.append(
            Finding(
                "warning",
                "load",
                f"load average {cpu.load_average:.1f} on {cpu.usable_cpus} CPU(s): other processes compete",
                "measure speed on an idle machine; on the line PC stop other CPU-heavy jobs",
            )
        )
    return findings


def _speed_findings(speed: SpeedCheck) -> list[Finding]:
    scaling = speed.matmul_gflops / max(speed.matmul_gflops_one_thread, 1e-9)
    message = (
        f"matmul {speed.matmul_gflops:.0f} GFLOP/s on {speed.threads} thread(s) "
        f"({speed.matmul_gflops_one_thread:.0f} on one: {scaling:.1f}x), conv {speed.conv_images_per_second:.0f} img/s"
    )
    if speed.threads > 1 and scaling < 0.5 * speed.threads:
        return [
            Finding(
                "warning",
                "speed",
                message + ": threads do not scale",
                "fewer torch threads may be faster here; check for other busy processes and OMP settings",
            )
        ]
    return [Finding("ok", "speed", message)]


def _resource_findings(report: EnvironmentReport) -> list[Finding]:
    findings = []
    if report.versions.get("torch") is None:
        findings.append(
            Finding(
                "info",
                "torch",
                "torch is not installed: only the runtime (ONNX bundles) works",
                "pip install 'defectdet[train]' to train",
            )
        )
    if report.shm_total_bytes is not None and report.shm_total_bytes < SHM_WARN_BYTES:
        findings.append(
            Finding(
                "warning",
                "shm",
                f"/dev/shm is {format_bytes(report.shm_total_bytes)}: DataLoader workers pass batches "
                "through it and die with a bus error when it fills",
                "docker run --shm-size=2g (or --ipc=host), or train with --workers 0",
            )
        )
    if report.disk_free_bytes < 2 << 30:
        findings.append(
            Finding(
                "warning",
                "disk",
                f"{format_bytes(report.disk_free_bytes)} free at {report.disk_path}: checkpoints may fail to save",
                "free disk space or point --out to a larger disk",
            )
        )
    cpu = report.cpu
    if not cpu.flags.get("AVX2"):
        findings.append(
            Finding(
                "warning",
                "cpu",
                "no AVX2: torch and ONNX Runtime run far slower on this CPU",
                "use the nano preset and a smaller --input-size on this machine",
            )
        )
    if "CUDAExecutionProvider" in report.onnxruntime_providers and not report.gpus:
        findings.append(Finding("info", "gpu", "ONNX Runtime has CUDA, torch sees no GPU"))
    return findings


def environment_report(speed_seconds: float = 5.0, disk_path: str | Path = ".") -> EnvironmentReport:
    """Inspect this machine; `speed_seconds=0` skips the speed check."""
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    try:
        import onnxruntime

        providers = list(onnxruntime.get_available_providers())
    except ImportError:
        providers = []
    try:
        shm = os.statvfs("/dev/shm")
        shm_total, shm_free = shm.f_blocks * shm.f_frsize, shm.f_bavail * shm.f_frsize
    except (OSError, AttributeError):
        shm_total = shm_free = None
    disk_path = Path(disk_path).resolve()
    report = EnvironmentReport(
        versions=package_versions(),
        cpu=cpu_info(),
        torch_threads=torch.get_num_threads() if torch else None,
        torch_interop_threads=torch.get_num_interop_threads() if torch else None,
        torch_cpu_capability=torch.backends.cpu.get_cpu_capability() if torch else None,
        thread_variables={name: os.environ[name] for name in THREAD_VARIABLES if name in os.environ},
        gpus=_gpus(torch),
        onnxruntime_providers=providers,
        disk_free_bytes=shutil.disk_usage(disk_path).free,
        disk_path=str(disk_path),
        shm_total_bytes=shm_total,
        shm_free_bytes=shm_free,
        speed=speed_check(speed_seconds) if torch is not None and speed_seconds > 0 else None,
        findings=[],
    )
    report.findings = _thread_findings(report) + _resource_findings(report)
    if report.speed is not None:
        report.findings += _speed_findings(report.speed)
    return report
