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

.PHONY: run test install bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# The bench extra (shap) is installed too: `make test` runs every bench/*.py --quick (tests/test_benchmarks.py);
# the ray extra too: the Ray backend's tests run on a local cluster.
$(STAMP): pyproject.toml Makefile | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev,bench,ray]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m trainers.cli run relay $(ARGS)

# The suite runs on every core (pytest-xdist, one torch thread per worker); Ray tests share one worker.
TEST_WORKERS ?= auto
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

bench: $(STAMP)  # every benchmark in full (make test runs their --quick modes)
	set -e; for script in bench/*.py; do echo "== $$script"; $(PY) $$script; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
