"""engine.host_memory: freed training memory stays in the process (fewer page faults), opt-out works."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's"
)

# Five training steps of the tiny model on 8 crops of 320 px (channels-last, as the trainer runs it), after eight
# warm-up steps, counting minor page faults: the memory pattern a CPU training step has.
PROBE = """
import json, resource, sys
import torch
from defectdet.engine.host_memory import keep_freed_memory
from defectdet.model import build_model
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
torch.manual_seed(0)
torch.set_num_threads(1)
model = build_model("tiny", num_classes=2, in_channels=1, template=False).to(memory_format=torch.channels_last)
images = torch.rand(8, 1, 320, 320).contiguous(memory_format=torch.channels_last)
targets = [torch.tensor([[0, 40.0, 40.0, 80.0, 76.0], [1, 150.0, 120.0, 190.0, 170.0]])] * 8
def step():
    model.zero_grad(set_to_none=False)
    loss = model(images, targets)["loss"]
    loss.backward()
    return loss
for _ in range(8):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    loss = step()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
gradients = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).double()
print(json.dumps({"applied": applied, "faults": faults, "loss": loss.item(), "gradient_sum": gradients.sum().item(),
                  "gradient_norm": gradients.norm().item()}))
"""


def probe(arm: str, **env: str) -> dict:
    completed = subprocess.run(
        [sys.executable, "-c", PROBE, arm],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_kept_memory_is_not_faulted_in_again():
    default, kept = probe("default"), probe("keep")
    assert default["applied"] is None
    assert kept["applied"] and "32 MiB" in kept["applied"]
    # without the setting freed activations go back to the kernel and are faulted in again every step
    assert kept["faults"] < default["faults"] / 3
    for key in ("loss", "gradient_sum", "gradient_norm"):  # the same computation, bit for bit
        assert kept[key] == default[key]


def test_opt_out_changes_nothing():
    opted_out = probe("keep", DEFECTDET_KEEP_FREED_MEMORY="0")
    assert opted_out["applied"] is None
    assert opted_out["faults"] > 3 * probe("keep")["faults"]
