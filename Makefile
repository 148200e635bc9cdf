# Two commands do all set-up:  `make lab` (learn)  and  `make test` (check everything).
# Both create the virtual environment and the offline data first when missing, and are fast when already set up.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PORT   ?= 8888
NOTEBOOK_DIR ?= .
# Two test processes; each file (a notebook, the browser module) stays in one process, in order; the longest files
# start first (tests/conftest.py: FIRST).
PYTEST_ARGS ?= -n 2 --dist loadfile --no-loadscope-reorder

.PHONY: setup data lab test test-fast walkthrough doctor clean-notebooks exercises bench gpu-check site cells

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

setup: $(STAMP)

data: setup
	$(PY) -m course_lib data prepare

lab: data
	$(PY) -m course_lib lab --port $(PORT) --notebook-dir $(NOTEBOOK_DIR)

# The tests use their own small data cache inside the repository (smoke sizes), never the learner's.
# Notebooks run by the tests have nobody to answer their questions: reveals are written out at once. Every Python
# process the tests start prints its threads' stacks when it crashes or is sent SIGABRT (a hung child, killed).
TEST_ENV := COURSE_MODE=smoke COURSE_DATA_DIR=$(CURDIR)/.cache/data COURSE_UNATTENDED=1 PYTHONFAULTHANDLER=1

test: setup
	$(TEST_ENV) $(PY) -m course_lib data prepare --quiet
	$(TEST_ENV) $(PY) -m pytest $(PYTEST_ARGS)

# The inner loop: the library's own tests, without notebooks, kernels, sandboxed graders or browsers (under 90 s).
test-fast: setup
	$(TEST_ENV) $(PY) -m course_lib data prepare --quiet
	$(TEST_ENV) $(PY) -m pytest -n 2 -m "not slow and not browser and not distributed" tests

# Run All of every lesson in Chromium, then answer each question (minutes; not part of `make test`).
walkthrough: setup
	$(TEST_ENV) $(PY) -m pytest -n 0 -s tests/walkthrough_questions.py

doctor: setup
	$(PY) -m course_lib doctor

exercises: setup
	$(PY) -m course_lib build-exercises

bench: data
	$(PY) -m course_lib bench

# On a machine with a CUDA GPU: GPU tests, every notebook, every grader and the GPU benchmark, in under 8 minutes;
# the table goes to benchmarks/results/gpu-<device>.md. Without a GPU it says so in one line.
gpu-check: setup
	$(PY) -m course_lib gpu-check $(GPU_CHECK_ARGS)

# The course website: every lesson executed in SITE_MODE (full: the outputs a learner gets, minutes per lesson;
# smoke: what the tests build), rendered offline to build/site/$(SITE_MODE)/html/index.html. Lessons that did not
# change since the last build are not executed again.
SITE_MODE ?= full
site: setup
	COURSE_MODE=$(SITE_MODE) $(PY) -m course_lib data prepare
	COURSE_MODE=$(SITE_MODE) $(PY) -m course_lib.website

# Every notebook's set-up cell and launch links, and the README's, from the library and pyproject.toml (idempotent;
# run after changing course_lib or [project.urls], and after merging notebook edits).
cells: setup
	$(PY) -m course_lib.bootstrap --write-cells
