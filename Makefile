# Two entry points: `make run` and `make test`. Both create .venv once and reinstall only
# when requirements.lock or pyproject.toml changed (the stamp file records that).
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed
PY := $(VENV)/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: run test setup clean

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/copus run experiments/quickstart.yaml --fresh

test: $(STAMP)
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) runs mlflow.db
