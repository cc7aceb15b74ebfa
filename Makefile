# Two entry points: `make run` and `make test`. Both create .venv once and reinstall only
# when requirements.lock or pyproject.toml changed (the stamp file records that).
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed
PY := $(VENV)/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: run test setup clean browser

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The product in one command: COPUS and the static baseline on one workload, then the comparison.
run: $(STAMP)
	$(VENV)/bin/copus compare experiments/quickstart_compare.yaml

# The suite in two parts: the tests without the slow marker (single-process, most of them) on two
# xdist processes, a test file to each at a time, so that neither core idles while the other runs
# one; then the slow ones (gloo ranks, Ray clusters, emulated nodes: they use every core and
# time their own steps) one at a time, as before.
# Byte-compiled first: where PYTHONDONTWRITEBYTECODE is set (it is on the machines this project
# is developed on) no import writes a .pyc, so every process the suite starts (each Ray worker,
# gloo rank and CLI run) would compile the project's modules again: about 0.25 s of CPU for a Ray
# worker's 62.
# Only what changed is compiled again.
test: $(STAMP) browser
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m compileall -q platform workloads tests bench >/dev/null
	$(PY) -m pytest -q -m "not slow" -n 2 --dist loadfile tests
	$(PY) -m pytest -q -m slow tests

# The report test opens the HTML in headless Chromium. Install Debian's headless shell once
# where we are root with apt (CI, fresh machines). Where CI=true the install must succeed, or
# make fails: a CI run must not pass with the browser checks skipped. Elsewhere (a user's make
# test without root) the browser check is skipped, and both this step and the tests say so.
# A Chromium is looked for as the tests look for it (tests/browser.py).
browser: $(STAMP)
	@$(PY) -c "from tests.browser import browser; raise SystemExit(browser() is None)" || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium-headless-shell) >/dev/null 2>&1 \
	    && echo "installed chromium-headless-shell for the report test"; } || \
	  { [ "$${CI:-}" = true ] && echo "CI=true: no Chromium, and it could not be installed (needs root and apt): the report's browser check must run" >&2 && exit 1; } || \
	  echo "no Chromium and no apt as root: the report's browser check will be skipped"

clean:
	rm -rf $(VENV) runs mlflow.db mlartifacts
