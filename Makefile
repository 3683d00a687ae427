# meshbayes set-up and entry points. Every target creates .venv and installs the
# pinned dependencies first, so each works on a fresh machine with only Python.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Test files run on this many processes (pytest-xdist; each file stays on one, so its
# module fixtures run once): 2 fills CI's 2 cores, most tests being single-threaded compiles.
TEST_WORKERS ?= 2

.PHONY: install data demo experiment demo-synthetic demo-layers examples planet planet-ablation test test-slow test-tpu test-gpu-aot clean scaling scaling-full scaling-gpu roofline bench

install: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c requirements.lock -e '.[dev]'
	touch $(STAMP)

# The offline translation corpus: Tatoeba English-French splits and their 8000-piece
# SentencePiece vocabulary under data/ (or $MESHBAYES_DATA_DIR). Fetches one source
# package (nmt==0.0.6, checked by SHA-256) from the registry; a second run does nothing.
data: $(STAMP)
	$(PY) -m meshbayes.tools.prepare_data
	$(PY) -m meshbayes.tools.train_vocab --task=tatoeba_enfr --vocab_size=8000

# The main job, the paper's comparison in miniature on a fresh machine: the offline
# corpus and its vocabulary (make data), then every uncertainty method of
# tools/experiment.py on the same 20,000-pair Tatoeba subset and architecture
# (gin_configs/uncertainty/): the deterministic Transformer (as it is and
# temperature-scaled), MC dropout and Bayesian layers trained and evaluated on test
# pairs (BLEU, calibration, OOD), and the table side by side (a clean run each time).
# `make demo DEMO_METHODS=deterministic,mc_dropout,ensemble,bayesian,ivon,laplace` adds the
# others (meshbayes.evaluation.methods lists them).
DEMO_DIR := runs/demo
DEMO_METHODS ?= deterministic,mc_dropout,bayesian
# `make experiment`: "sequence calibration decided on CPU" (docs/results/2026-11-29-
# sequence-calibration-design.md, fixed before its runs): the deterministic grid past its
# edge (peak rate 6e-3 and 1.2e-2, and 2.4e-2 if 1.2e-2 wins), then the deterministic
# model and the Bayesian layers at seeds 200-204 (their ensemble of five), MAP and the
# noise arms at 200-202, every run capped at 12,000 steps with early stopping and
# evaluated at its best checkpoint on all 2,000 test sources, the deterministic and
# Bayesian runs also on 24,000 pool sources; at most 50 CPU-hours, after which nothing
# new starts (runs/sequence_cpu/not_run.json says what was given up). About 25 hours on
# 2 cores (estimated: the design's 44-54 CPU-hours, two commands at a time; not measured
# yet). It resumes where an interrupted call stopped (remove $(EXPERIMENT_DIR) to start
# afresh). `--preset=cpu` is "is being Bayesian worth it" (docs/results/2026-11-28-
# bayesian-worth-it-design.md; about 4.5 hours on 2 cores, measured: docs/results/2026-11-
# 29-bayesian-worth-it.md); `--preset=sequence_calibration` the 3,000-step sequence
# calibration experiment (about 8.6 CPU-hours, measured: docs/results/2026-11-28-sequence-
# calibration.md); the tuning grids that chose each method's settings are separate
# commands (docs/uncertainty.md).
EXPERIMENT_DIR := runs/sequence_cpu
EXPERIMENT := $(PY) -m meshbayes.tools.experiment --preset=sequence_cpu --out=$(EXPERIMENT_DIR)

demo: data
	rm -rf $(DEMO_DIR)
	$(PY) -m meshbayes.tools.experiment --preset=demo --methods=$(DEMO_METHODS) --out=$(DEMO_DIR)

experiment: data
	$(EXPERIMENT) --tune=deterministic --grid=optimizers.LearningRate.base=6e-3,1.2e-2 \
	  --past_edge=2.4e-2
	$(EXPERIMENT)

# Issue 70's quality experiment (docs/results/2026-11-29-grouped-quality-design.md, fixed
# before its runs): the Bayesian layers' recipe with its own estimators, with the grouped
# reparameterization at k = 2 and at k = 1, seeds 100-102 in seed order, each run capped at
# 12,000 steps with early stopping and scored at its best checkpoint on the validation split;
# at most 8 CPU-hours (estimated 7.2, not measured yet). Writes runs/estimator_quality/
# estimator_quality.md (the paired differences and the rule's verdict); it resumes where an
# interrupted call stopped.
.PHONY: estimator-quality
estimator-quality: data
	$(PY) -m meshbayes.tools.experiment --preset=estimator_quality --out=runs/estimator_quality

# The trainer on the synthetic reverse task (no data needed): about two minutes.
demo-synthetic: $(STAMP)
	rm -rf runs/demo-synthetic
	$(PY) -m meshbayes.train --gin_file=gin_configs/examples/tiny_synthetic_bayesian.gin \
	  --gin.MODEL_DIR="'runs/demo-synthetic'" --gin.TRAIN_STEPS=1500 --gin.train.log_period=100 \
	  --gin.run_configs.EvaluationConfig.period=500
	$(PY) -m meshbayes.eval --gin_file=runs/eval.gin \
	  --gin_file=tasks/synthetic.gin --gin.MODEL_DIR="'runs/demo-synthetic'" --gin.BATCH_SIZE=64 \
	  --gin.evaluation.DecodeConfig.method="'greedy'"

# The layer library on its own: a Bayesian MLP in a few seconds.
demo-layers: $(STAMP)
	$(PY) -m meshbayes.demo

# The layer library's examples at full size (meshbayes/examples): figures and JSONs
# under runs/examples/, about ten CPU minutes in all; char_lstm reads `make data`'s corpus.
examples: data
	$(PY) -m meshbayes.examples.sin_regression
	$(PY) -m meshbayes.examples.lenet_digits
	$(PY) -m meshbayes.examples.resnet
	$(PY) -m meshbayes.examples.char_lstm
	$(PY) -m meshbayes.examples.flow_moons
	$(PY) -m meshbayes.examples.vqvae_digits
	$(PY) -m meshbayes.examples.pixel_mixture
	OPENBLAS_NUM_THREADS=1 $(PY) -m meshbayes.examples.deep_gp_diabetes
	OPENBLAS_NUM_THREADS=1 $(PY) -m meshbayes.examples.cox_process

# PlaNet and Bayesian PlaNet (the transition's Dense layers DenseReparameterization) on the
# pendulum from 32x32 pixels, seeds 0-6, the two agents of a seed back to back
# (docs/planet.md): held-out returns per decision rule paired by seed against the margin
# fixed in advance, cost ratios, weight KL, open-loop error, velocity probe.
# runs/planet/planet.json and planet.png; a rerun reuses finished seeds. 66 minutes on 2 cores.
PLANET_DIR ?= runs/planet
planet: $(STAMP)
	$(PY) -m meshbayes.tools.planet --preset=cpu --seeds=7 --out=$(PLANET_DIR)

# Why Bayesian PlaNet falls behind: the factorial ablation fixed in advance
# (docs/results/2026-11-29-planet-ablation-design.md), six cells at seeds 0-6, the F and P
# reruns compared bit for bit with the published runs. runs/planet_ablation/ablation.json;
# resumable. About 3.3 hours on 2 cores (42 runs).
PLANET_ABLATION_DIR ?= runs/planet_ablation
planet-ablation: $(STAMP)
	$(PY) -m meshbayes.tools.planet_ablation --preset=cpu --seeds=7 \
	  --published=docs/planet/2026-11-28/runs --out=$(PLANET_ABLATION_DIR)

test: $(STAMP)
	$(PY) -m pytest -m 'not slow' -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -m slow -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Ahead-of-time compiles for TPU topologies need libtpu (the `tpu` extra); the
# default install leaves it out, and these tests skip without it.
test-tpu: $(STAMP)
	$(PY) -m pip install --quiet -c requirements.lock -e '.[dev,tpu]'
	$(PY) -m pytest -m tpu $(PYTEST_ARGS)

# Ahead-of-time compiles for NVIDIA GPUs without a GPU need JAX's CUDA plugin (the `gpu-aot`
# extra, about 5.5 GB), in a venv of its own so that the default one never looks for a GPU:
# the train step's memory on one H100 and one H200, a node of eight H100s, and the frozen
# step-time model checked on deviceless compiles of the code measured on the H200 (about 15
# minutes on 2 cores, install aside). GPU studies run in it too, e.g.
# `.venv-gpu-aot/bin/python -m meshbayes.tools.scaling_study --topologies=h200:1 ...`.
GPU_AOT_VENV := .venv-gpu-aot
GPU_AOT_STAMP := $(GPU_AOT_VENV)/.installed

$(GPU_AOT_STAMP): pyproject.toml requirements.lock
	test -x $(GPU_AOT_VENV)/bin/python || $(PYTHON) -m venv $(GPU_AOT_VENV)
	$(GPU_AOT_VENV)/bin/python -m pip install --quiet -c requirements.lock -e '.[dev,gpu-aot]'
	touch $(GPU_AOT_STAMP)

test-gpu-aot: $(GPU_AOT_STAMP)
	$(GPU_AOT_VENV)/bin/python -m pytest -m gpu_aot $(PYTEST_ARGS)

# The GPU studies of docs/scaling.md into docs/scaling/ (deviceless, the gpu-aot venv): the
# train step of base and paper on one H100 and one H200 (memory, fit, the frozen model's
# step time), and the largest Bayesian Transformer one H200 trains, without and with full
# remat (about 30 minutes on 2 cores).
GPU_SCALING := $(GPU_AOT_VENV)/bin/python -m meshbayes.tools.scaling_study --partitioning=data_only \
  --model_parallel=1 --dtype=bfloat16
scaling-gpu: $(GPU_AOT_STAMP)
	$(GPU_SCALING) --model=base --topologies=h100:1,h200:1 --batch_size=32 --remat=none \
	  --compare_deterministic --title="base preset, 32 x 256, on one H100 and one H200" \
	  --json=docs/scaling/gpu_base.json
	$(GPU_SCALING) --model=paper --topologies=h100:1,h200:1 --batch_size=8 --remat=none \
	  --compare_deterministic --title="paper preset, 8 x 256, on one H100 and one H200" \
	  --json=docs/scaling/gpu_paper.json
	$(GPU_SCALING) --model=paper --topologies=h100:1,h200:1 --batch_size=8 --remat=full \
	  --compare_deterministic \
	  --title="paper preset, 8 x 256, rematerialized, on one H100 and one H200" \
	  --json=docs/scaling/gpu_paper_remat.json
	$(GPU_SCALING) --model=paper --topologies=h200:1 --batch_size=8 --remat=none \
	  --search_layers=6 --search_step=128 \
	  --title="Largest Bayesian Transformer on one H200 (AdamW, 8 x 256, no remat)" \
	  --json=docs/scaling/search_h200.json
	$(GPU_SCALING) --model=paper --topologies=h200:1 --batch_size=8 --remat=full \
	  --search_layers=6 --search_step=128 \
	  --title="Largest Bayesian Transformer on one H200 (AdamW, 8 x 256, full remat)" \
	  --json=docs/scaling/search_h200_remat.json

# Scaling studies (docs/scaling.md): the trainer's step compiled ahead of time for TPU
# topologies; installs the `tpu` extra (libtpu), no TPU needed. `make scaling` runs the
# quick subset, study 1 (the paper preset, Bayesian and deterministic, on 8 to 512 TPUv2
# cores: about 10 minutes on 2 cores) into runs/scaling/; `make scaling-full` reruns
# every study of docs/scaling.md into docs/scaling/ (about 1.5 hours: a 512-core compile
# takes minutes, and each search compiles 8 to 10 models).
SCALING_DIR ?= runs/scaling
SCALING := $(PY) -m meshbayes.tools.scaling_study
scaling: $(STAMP)
	$(PY) -m pip install --quiet -c requirements.lock -e '.[dev,tpu]'
	$(SCALING) --model=paper --topologies=v2:2x2,v2:4x4,v2:8x8,v2:16x16 --compare_deterministic \
	  --json=$(SCALING_DIR)/paper_v2.json

scaling-full: $(STAMP)
	$(PY) -m pip install --quiet -c requirements.lock -e '.[dev,tpu]'
	$(SCALING) --model=paper --topologies=v2:2x2,v2:4x4,v2:8x8,v2:16x16 --compare_deterministic \
	  --title="paper preset on TPUv2: Bayesian and deterministic" --json=docs/scaling/paper_v2.json
	$(SCALING) --model=10b --topologies=v2:16x16 --title="10b preset on v2-512" \
	  --json=docs/scaling/10b_v2.json
	$(SCALING) --model=10b --topologies=v2:16x16 --remat=full \
	  --title="10b preset on v2-512, rematerialized" --json=docs/scaling/10b_v2_remat.json
	$(SCALING) --model=paper --topologies=v2:16x16 --compare_deterministic --remat=full \
	  --title="paper preset on v2-512, rematerialized: Bayesian and deterministic" \
	  --json=docs/scaling/paper_v2_remat.json
	$(SCALING) --model=paper --topologies=v2:2x2,v2:4x4,v2:8x8 --remat=full \
	  --title="paper preset on smaller TPUv2 slices, rematerialized" \
	  --json=docs/scaling/paper_v2_small_remat.json
	$(SCALING) --model=paper --topologies=v2:16x16 --estimators=mlp=deterministic \
	  --title="paper preset on v2-512: Flipout attention only" \
	  --json=docs/scaling/paper_v2_flipout_only.json
	$(SCALING) --model=paper --topologies=v2:16x16 \
	  --estimators=attention=deterministic,cross_attention=deterministic \
	  --title="paper preset on v2-512: local reparameterization feed-forward only" \
	  --json=docs/scaling/paper_v2_lr_only.json
	$(SCALING) --model=paper --topologies=v2:16x16 --remat=full --search_layers=6,12 \
	  --title="Largest Bayesian Transformer on v2-512 (AdamW, rematerialized)" \
	  --json=docs/scaling/search_v2.json
	$(SCALING) --model=paper --topologies=v2:8x8,v2:16x16 --deterministic --optimizer=ivon \
	  --title="paper preset on TPUv2: the deterministic model trained by IVON" \
	  --json=docs/scaling/paper_v2_ivon.json
	$(SCALING) --model=paper --topologies=v4:8x8x8 --remat=full --search_layers=6,12 \
	  --title="Largest Bayesian Transformer on v4-512 (AdamW, rematerialized)" \
	  --json=docs/scaling/search_v4.json
	$(SCALING) --model=paper --topologies=v2:2x2,v2:4x4,v2:8x8,v2:16x16 --compare_deterministic \
	  --title="paper preset on TPUv2, with replica groups and HBM bytes for the roofline" \
	  --json=docs/scaling/roofline_paper_v2.json
	$(SCALING) --model=paper --topologies=v2:16x16 --compare_deterministic --dtype=bfloat16 \
	  --title="paper preset on v2-512, bfloat16 compute" --json=docs/scaling/roofline_paper_v2_bf16.json
	$(SCALING) --model=paper --num_heads=32 --mlp_dim=16384 --topologies=v2:2x2,v2:4x4,v2:8x8,v2:16x16 \
	  --batch_size=4 --weak_scaling --compare_deterministic \
	  --title="weak scaling on TPUv2: the paper preset at a quarter of its width, 4 sequences per data row" \
	  --json=docs/scaling/roofline_weak_quarter_v2.json
	$(SCALING) --model=paper --remat=full --topologies=v2:2x2,v2:4x4,v2:8x8,v2:16x16 \
	  --batch_size=4 --weak_scaling --compare_deterministic \
	  --title="weak scaling on TPUv2: the paper preset, rematerialized, 4 sequences per data row" \
	  --json=docs/scaling/roofline_weak_paper_remat_v2.json

# Predicted step times on TPU pods (docs/performance.md), recomputed from the roofline
# studies' JSONs: no compile, no libtpu, seconds.
ROOFLINE_JSONS := $(addprefix docs/scaling/roofline_,paper_v2.json paper_v2_bf16.json \
  weak_quarter_v2.json weak_paper_remat_v2.json)
roofline: $(STAMP)
	$(SCALING) --from_json $(ROOFLINE_JSONS)

# The cost of being Bayesian on this machine (tools/bench.py): JSON reports on stdout, about
# 25 minutes on 2 CPU cores (the pipeline section reads tatoeba_enfr). The train step and the
# Dense layers run with malloc's buffers reused (MESHBAYES_MALLOC=reuse, meshbayes/runtime/host_memory.py:
# no page faults blurring the arithmetic; runs/bench_steps.json), the rest with the default
# (runs/bench.json).
bench: data
	mkdir -p runs
	MESHBAYES_MALLOC=reuse $(PY) -m meshbayes.tools.bench --sections=step,layers \
	  --json=runs/bench_steps.json
	$(PY) -m meshbayes.tools.bench --sections=pipeline,decode,trainer,resume --json=runs/bench.json

clean:
	rm -rf $(VENV) $(GPU_AOT_VENV) .pytest_cache build *.egg-info runs/demo runs/demo-synthetic
