#!/bin/bash
# How bench/gpu.py's parts ran on a lent GPU machine (the `device` tool): its image has torch and CUDA but not
# our training dependencies, which travel as wheels in .whl/ (git-ignored), and DeepPCB travels in
# .gpudata/deeppcb as lossless WebP of the same decoded pixels (the JPEGs exceed the 64 MiB transfer).
# Budgets in minutes: DEEPPCB_MIN, SURFACE_MIN, YOLO_MIN. Results and one log archive go to $OUT.
set -u
OUT=${OUT:-runs/gpu_out}
mkdir -p "$OUT" runs/bench_gpu
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
LOGS=runs/bench_gpu/logs
mkdir -p $LOGS
nvidia-smi > $LOGS/nvidia_smi.txt 2>&1
python3 -c "import torch, albumentations, pycocotools, defectdet.engine.trainer; print(torch.__version__, torch.cuda.is_available())" 2>&1 | tee $LOGS/env_check.txt
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || exit 4
# the surface family is drawn while DeepPCB trains (one core of the machine's 16)
python3 -c "from pathlib import Path; from bench import train_surface; train_surface.make_dataset(Path('runs/bench_surface/data'), 600, 0)" > $LOGS/surface_data.log 2>&1 &
run_part() {  # part minutes [extra args]
    local part=$1 minutes=$2; shift 2
    timeout $(python3 -c "print(int($minutes * 60 + 150))") python3 -m bench.gpu --part $part --minutes $minutes \
        --results "$OUT" "$@" > $LOGS/$part.log 2>&1
    echo "$part exit $?" | tee -a $LOGS/parts.txt
    tail -12 $LOGS/$part.log
}
run_part deeppcb_template ${DEEPPCB_MIN:-1} --data .gpudata/deeppcb
wait
run_part surface ${SURFACE_MIN:-2}
run_part yolo_surface ${YOLO_MIN:-2} --peers-python python3
cp runs/bench_gpu/yolo_surface/yolo11n/yolo11n.log $LOGS/ 2>/dev/null
tar czf "$OUT/logs.tar.gz" $LOGS runs/bench_gpu/*/metrics.csv 2>/dev/null
ls -la "$OUT"
