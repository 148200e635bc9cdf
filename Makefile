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

.PHONY: setup data lab lab-check test test-fast test-oldest test-newest walkthrough doctor clean-notebooks exercises \
        bench gpu-check site cells mutation

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

# Every lesson in a real Chromium, as a learner runs it: Run All, no error, then closed with Discard and unchanged on
# disk (`make test` does this for lessons 00 and 02; this takes every lesson: 13 minutes on 2 busy cores).
lab-check: setup
	$(TEST_ENV) $(PY) -m course_lib data prepare --quiet
	$(TEST_ENV) COURSE_BROWSER_LESSONS=all $(PY) -m pytest -n 0 tests/test_browser.py

# The inner loop: the library's own tests, without notebooks, kernels, sandboxed graders or browsers (under 90 s).
test-fast: setup
	$(TEST_ENV) $(PY) -m course_lib data prepare --quiet
	$(TEST_ENV) $(PY) -m pytest -n 2 -m "not slow and not browser and not distributed" tests

# The dependency range pyproject.toml claims, tested at both ends (not part of `make test`: each end downloads GBs).
# test-oldest: every dependency at its floor (.ci/oldest_pins.py pins each `>=X` to `==X`), in .venv-oldest.
# test-newest: the newest release of everything, torch included, in .venv-newest; PIP_CONSTRAINT=/dev/null sets aside
# a cap that pip's own configuration may hold (an empty PIP_CONSTRAINT would be ignored).
# Each runs test-fast's selection and then, whatever it gave, the lessons and solutions that launch torchrun, on its
# own smoke data (drawn by its own Pillow: `data prepare` refuses to repair files another Pillow drew).
# RANGE_ARGS=-n 0: one test process.
RANGE_ARGS ?= -n 2 --dist loadfile
RANGE_ENV = $(TEST_ENV) COURSE_DATA_DIR=$(CURDIR)/.venv-$*/data
RANGE_NOTEBOOKS := 'tests/test_lessons.py::test_lesson_runs[09_distributed]' \
                   'tests/test_lessons.py::test_lesson_runs[13_parallel]' solutions/11_ddp.ipynb solutions/21_parallel.ipynb

.venv-oldest/.installed-stamp: pyproject.toml .ci/oldest_pins.py
	@test -x .venv-oldest/bin/python || $(PYTHON) -m venv .venv-oldest
	$(PYTHON) .ci/oldest_pins.py > .venv-oldest/floors.txt
	.venv-oldest/bin/python -m pip install -q --upgrade pip
	.venv-oldest/bin/python -m pip install -q -c .venv-oldest/floors.txt -e '.[dev]'
	@touch $@

.venv-newest/.installed-stamp: pyproject.toml
	@test -x .venv-newest/bin/python || $(PYTHON) -m venv .venv-newest
	.venv-newest/bin/python -m pip install -q --upgrade pip
	PIP_CONSTRAINT=/dev/null .venv-newest/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e '.[dev]'
	@touch $@

test-oldest test-newest: test-%: .venv-%/.installed-stamp
	@.venv-$*/bin/python -c 'import sys, torch, torchvision, lightning; print("python", sys.version.split()[0], \
		"torch", torch.__version__, "torchvision", torchvision.__version__, "lightning", lightning.__version__)'
	$(RANGE_ENV) .venv-$*/bin/python -m course_lib data prepare --quiet
	$(RANGE_ENV) .venv-$*/bin/python -m pytest $(RANGE_ARGS) -m "not slow and not browser and not distributed" tests; \
	fast=$$?; $(RANGE_ENV) .venv-$*/bin/python -m pytest $(RANGE_ARGS) $(RANGE_NOTEBOOKS) && exit $$fast

# Run All of every lesson in Chromium, then answer each question (minutes; not part of `make test`).
walkthrough: setup
	$(TEST_ENV) $(PY) -m pytest -n 0 -s tests/walkthrough_questions.py

doctor: setup
	$(PY) -m course_lib doctor

exercises: setup
	$(PY) -m course_lib build-exercises

bench: data
	$(PY) -m course_lib bench

# How much of each solution the checks pin down: every small change to the graded code (a flipped comparison, a
# replaced number, a dropped term...) judged by the real checks; the report goes to docs/mutation.md (tens of
# minutes; not part of `make test`). MUTATION_ARGS="--exercise 05 --timeout 30" runs one exercise.
mutation: setup
	$(TEST_ENV) $(PY) -m course_lib.grading.mutation $(MUTATION_ARGS)

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
