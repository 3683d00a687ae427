# meshbayes set-up and entry points. Every target creates .venv and installs the
# pinned dependencies first, so each works on a fresh machine with only Python.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo test test-slow test-tpu clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c requirements.lock -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
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
	rm -rf $(VENV) .pytest_cache build *.egg-info
