"""Two CPU processes (gloo) train a tiny model with DDP; ranks must agree and the checkpoint must resume."""

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from fakes import TinyDataset, TinyDetector

from defectdet.engine.checkpoint import load_checkpoint
from defectdet.engine.trainer import TrainData, train

HERE = Path(__file__).resolve().parent

WORKER = textwrap.dedent("""
    import os, sys
    import torch
    import torch.multiprocessing as mp

    def worker(rank, out, port):
        os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
        torch.set_num_threads(1)
        from defectdet.engine.config import TrainConfig
        from defectdet.engine.trainer import TrainData, train
        from fakes import TinyDataset, TinyDetector
        torch.manual_seed(rank)  # different inits: DDP must broadcast rank 0's weights
        model = TinyDetector()
        config = TrainConfig(epochs=2, batch=2, workers=0, device="cpu", out=out, progress=False, val_split=None,
                             warmup_steps=1, lr=0.01)
        train(config, data=TrainData(TinyDataset(16), None, ["a", "b"]), model=model)
        torch.save(model.state_dict(), f"{out}/rank{rank}.pt")

    if __name__ == "__main__":
        mp.spawn(worker, args=(sys.argv[1], int(sys.argv[2])), nprocs=2, join=True)
""")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_process_ddp_and_single_process_resume(tmp_path, small_train_config):
    script = tmp_path / "ddp_worker.py"
    script.write_text(WORKER)
    out = tmp_path / "run"
    src = HERE.parents[1] / "src"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(src), os.environ.get("PYTHONPATH", "")]),
    }
    completed = subprocess.run(
        [sys.executable, str(script), str(out), str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    rank0, rank1 = torch.load(out / "rank0.pt"), torch.load(out / "rank1.pt")
    parameter_names = [name for name, _ in TinyDetector().named_parameters()]
    for key in parameter_names:  # BN running stats are rank-local between DDP's buffer broadcasts
        assert torch.equal(rank0[key], rank1[key]), key
    checkpoint = load_checkpoint(out / "last.pt")
    assert checkpoint["step"] == 8  # 16 samples / (2 ranks x batch 2) = 4 steps per epoch
    assert not any(key.startswith("module.") for key in checkpoint["model"])
    for key, value in rank0.items():
        assert torch.equal(checkpoint["model"][key], value), key

    # the DDP checkpoint resumes in a single process
    config = small_train_config(
        tmp_path / "single",
        epochs=3,
        batch=4,
        warmup_steps=None,
        val_split=None,
        resume=out / "last.pt",
        lr=0.01,
    )
    model = TinyDetector()
    result = train(config, data=TrainData(TinyDataset(16), None, ["a", "b"]), model=model)
    assert result.state.epoch == 3 and result.state.step == 12
