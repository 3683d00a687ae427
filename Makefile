# meshbayes set-up and entry points. Every target creates .venv and installs the
# pinned dependencies first, so each works on a fresh machine with only Python.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo demo-layers test test-slow test-tpu clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c requirements.lock -e '.[dev]'
	touch $(STAMP)

# The main job: the tiny Bayesian Transformer trained on the synthetic task through
# the trainer, then evaluated (a clean run each time).
DEMO_DIR := runs/demo
demo: $(STAMP)
	rm -rf $(DEMO_DIR)
	$(PY) -m meshbayes.train --gin_file=gin_configs/examples/tiny_synthetic_bayesian.gin \
	  --gin.MODEL_DIR="'$(DEMO_DIR)'" --gin.TRAIN_STEPS=1500 --gin.train.log_period=100 \
	  --gin.train.eval_period=500
	$(PY) -m meshbayes.eval --gin_file=models/tiny.gin --gin_file=runs/eval.gin \
	  --gin_file=tasks/synthetic.gin --gin.MODEL_DIR="'$(DEMO_DIR)'" --gin.BATCH_SIZE=64 \
	  --gin.evaluate.decode_method="'greedy'"

# The layer library on its own: a Bayesian MLP in a few seconds.
demo-layers: $(STAMP)
	$(PY) -m meshbayes.demo

test: $(STAMP)
	$(PY) -m pytest -m 'not slow' $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

# Ahead-of-time compiles for TPU topologies need libtpu (the `tpu` extra); the
# default install leaves it out, and these tests skip without it.
test-tpu: $(STAMP)
	$(PY) -m pip install --quiet -c requirements.lock -e '.[dev,tpu]'
	$(PY) -m pytest -m tpu $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info runs/demo
