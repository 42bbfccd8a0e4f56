# defectdet — the commands a new user and CI run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_VERSION := 2.13.0
# PyTorch's CPU-only index: the build without CUDA (about 200 MB instead of several GB). Wheels already on the
# machine (pip's find-links) still serve an offline install. For a CUDA build:
# `make install TORCH_INDEX=https://pypi.org/simple`.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: install test docs demo bench bench-pages bench-serve-overhead bench-peers bench-pretrained bench-scaling pretrain lint lint-deploy lock check-lock clean

install: $(STAMP)

# The pinned CPU torch goes in first, from the CPU-only index: an unpinned torch from PyPI is a multi-GB CUDA build. Every other package
# gets the version in constraints.txt, the set the test suite passed with (`make lock` rewrites it).
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --retries 1 --index-url $(TORCH_INDEX) torch==$(TORCH_VERSION)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# After a dependency change: install without the old pins, test, then `make lock`.
lock:
	{ echo "# The versions the test suite passed with (make lock rewrites this file; make install and CI use it)."; \
	  $(BIN)/pip freeze --exclude-editable | sed 's/^torch==$(TORCH_VERSION)+cpu$$/torch==$(TORCH_VERSION)/' \
	  | LC_ALL=C sort -f; } > constraints.txt

check-lock: $(STAMP)
	$(BIN)/python .ci/check_constraints.py $(BIN)/python

# One worker per core (pytest-xdist; an idle worker takes tests queued for the other, so the long walks do
# not leave one core waiting at the end); `pytest -m "not slow"` leaves out the end-to-end walks while iterating.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist worksteal tests

# The documentation site (mkdocs.yml): --strict fails on a broken link, a missing anchor or a page not in the nav.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

demo: $(STAMP)
	$(BIN)/defectdet demo --out runs/demo

# The standard benchmarks, about 2 hours (`python -m bench` lists every suite with its commands and rough
# minutes; `python -m bench run --suite quick` is a smoke run without a dataset).
bench: $(STAMP)
	$(BIN)/python -m bench run --suite standard

# Side by side with Ultralytics YOLO (issue 13; about 1.5 hours, not part of `make test`). Ultralytics is AGPL-3.0:
# it lives only in .venv-peers, never in .venv. torch/torchvision are pinned in every pip call so that pip takes
# the builds on this machine's disk and never upgrades torch; onnx/onnxslim/onnxruntime serve their ONNX export.
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed
PEERS_TORCH := torch==2.14.1 torchvision==0.29.1

$(PEERS_STAMP):
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/pip install --quiet $(PEERS_TORCH)
	$(PEERS_VENV)/bin/pip install --quiet $(PEERS_TORCH) ultralytics onnx onnxslim onnxruntime
	touch $(PEERS_STAMP)

# YOLO on the budget ladder (issue 20): each rung dataset:model:imgsz:minutes trains in .venv-peers at 1 thread
# and writes its own JSON (bench/peers_ladder.py); ours come from the ladder's runs (make bench-scaling). Then the
# curves (peers_ladder.json, one PNG per dataset) and latency at matched sizes. About 5 CPU hours for every rung:
# run rungs one at a time (make bench-peers PEERS_RUNGS="surface:yolo11n:352:30"), pinned to a core if you can.
PEERS_RUNGS ?= surface:yolo11n:352:10 surface:yolov8n:352:10 surface:yolo11n:640:10 deeppcb_plain:yolo11n:640:10 \
	deeppcb_plain:yolo11n:320:10 deeppcb_template:yolo11n:320:10 surface:yolo11n:352:30 deeppcb_plain:yolo11n:640:30 surface:yolo11n:352:60 \
	deeppcb_plain:yolo11n:640:60
bench-peers: $(STAMP) $(PEERS_STAMP)
	for rung in $(PEERS_RUNGS); do OMP_NUM_THREADS=1 $(BIN)/python -m bench.peers_ladder --rung $$rung --threads 1; done
	$(BIN)/python -m bench.peers_ladder --summary
	$(BIN)/python -m bench.peers_latency --threads 1

# The starting weights shipped in src/defectdet/model/weights (bench/pretrain.py; budget in the README). Only the
# plain layout ships: template weights (bench/pretrain.py --layout template --epochs 30) lost to random ones on
# DeepPCB with templates (bench/results/pretrained_deeppcb_template_*_10min.json).
pretrain: $(STAMP)
	for preset in nano tiny; do \
	  OMP_NUM_THREADS=1 $(BIN)/python -m bench.pretrain --preset $$preset --layout plain --epochs 24 --boards 800 --surfaces 1200 || exit 1; \
	done

# Shipped weights against random ones (issue 19): per dataset the two inits side by side at 1 thread each,
# 10 minutes per arm, about 25 minutes in all; then the table and PNG. The pretrained arm is the budget ladder's
# 10-minute rung (the product's defaults), which --summary reads. The template-layout pair needs weights that
# do not ship: bench/pretrain.py --layout template --epochs 30 --weights-dir runs/pretrain/unshipped, then
# bench/pretrained.py --dataset deeppcb_template --init pretrained --threads 1 --weights-dir runs/pretrain/unshipped
# beside --init scratch.
bench-pretrained: $(STAMP)
	for dataset in deeppcb_plain surface; do \
	  $(BIN)/python -m bench.pretrained --dataset $$dataset --init scratch --threads 1 & \
	  $(BIN)/python -m bench.scaling --rung $$dataset:nano:10 --threads 1; wait; \
	done
	$(BIN)/python -m bench.pretrained --summary

# The budget ladder (issue 19): every rung without a result file yet (about 8 hours for all), then the curves.
bench-scaling: $(STAMP)
	$(BIN)/python -m bench.scaling --all

# The service's own cost: `defectdet serve` against the in-process Predictor on the same bundle and image pair,
# interleaved in one run at 1, 2, 4 and 8 clients, with the defaults, keep + models folder, and 2 workers
# (a few minutes; bench/results/serve_overhead.json).
bench-serve-overhead: $(STAMP)
	$(BIN)/python -m bench.serve_overhead

# The benchmark pages of the documentation site (docs/benchmarks/*.md and their plots) from bench/results/*.json.
bench-pages: $(STAMP)
	$(BIN)/python -m bench.pages

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

# The container image and Kubernetes files: hadolint on the Containerfile, the kustomize base rendered and
# validated against the Kubernetes schemas, the dashboard's metric names (make test runs the same checks).
lint-deploy: $(STAMP)
	$(BIN)/hadolint Containerfile
	rendered=$$(kubectl kustomize deploy/k8s/base) && printf '%s\n' "$$rendered" | $(BIN)/kubernetes-validate --strict --quiet -
	$(BIN)/python -m pytest -q tests/deploy/test_manifests.py

clean:
	rm -rf $(VENV) runs build *.egg-info src/*.egg-info .pytest_cache
