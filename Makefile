# Deep Learning Optimise -- set-up and entry points. `make run` and `make test` do all set-up themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dlo-installed
CACHE := $(CURDIR)/.cache
export TORCHINDUCTOR_CACHE_DIR ?= $(CACHE)/torchinductor
export TORCH_EXTENSIONS_DIR ?= $(CACHE)/torch_extensions
export MPLCONFIGDIR ?= $(CACHE)/matplotlib
export TRITON_CACHE_DIR ?= $(CACHE)/triton
export PIP_DISABLE_PIP_VERSION_CHECK := 1
PROFILE ?= auto
PYTEST_ARGS ?=

.PHONY: all install run test test-fast test-browser test-compat test-dry gpu-check student check-student lab clean distclean help

all: help

help:
	@echo "make run      - execute Jour1/jour1.ipynb (smoke on CPU, full on a GPU) into runs/jour1/"
	@echo "make test     - unit, distributed and notebook tests (what CI runs)"
	@echo "make test-browser - a student notebook in JupyterLab in headless Chromium (screenshots in runs/browser/)"
	@echo "make test-compat - a GPU node's Python (torch 2.11, no Jupyter) in .cache/venv-compat: lib tests, every notebook's dry profile"
	@echo "make test-dry    - every notebook's full profile rehearsed on a CPU (profile dry: full lists and branches, small sizes)"
	@echo "make gpu-check - on a GPU node: every full-profile benchmark against its target -> results/"
	@echo "make student  - regenerate the student notebooks from the sources"
	@echo "make lab      - start JupyterLab with the 'Python (dlo)' kernel"
	@echo "make clean    - remove runs/ and caches (keeps .venv)"

# The venv is (re)built when the pins change. torch goes first, alone and exactly pinned, so that
# nothing later can pull a different (CUDA, multi-GB) build; DeepSpeed's sdist needs torch importable
# at build time, hence --no-build-isolation for the whole list (setuptools/wheel are installed first).
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q $$(grep -E '^(torch|torchvision)==' requirements.txt)
	$(PY) -m pip install -q --no-build-isolation -r requirements.txt
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	$(KERNEL_INSTALL) --sys-prefix >/dev/null
	touch $@

# The kernel 'Python (dlo)' runs with the venv's bin first on PATH, so that `!dlo hint ...` in a notebook finds the
# course's command even when the Jupyter that starts the kernel is not the venv's (a JupyterHub). `${PATH}` is
# filled in by Jupyter when it starts the kernel. `make install` registers it again (an older venv's spec had no PATH).
VENV_BIN = $(abspath $(VENV))/bin
KERNEL_INSTALL = $(PY) -m ipykernel install --name dlo --display-name "Python (dlo)" --env PATH '$(VENV_BIN):$${PATH}'

install: $(STAMP)
	$(KERNEL_INSTALL) --sys-prefix >/dev/null

run: $(STAMP)
	$(VENV)/bin/dlo run Jour1/jour1.ipynb --profile $(PROFILE)

# `make test` = what CI runs, in four stages:
# 1. unit and distributed tests, two at a time (pytest-xdist): a file stays on one worker (its tests may share module
#    fixtures);
# 2. the wrong-answer corpus (~875 independent answers) and every notebook's full profile rehearsed on the CPU
#    (profile "dry", see test-dry below; without the exercise checks, which stage 3 runs), spread one test at a time
#    over REHEARSAL_WORKERS workers, the rehearsals (a minute or more each) first: they spend much of their time
#    starting processes and waiting for them, so three at a time keep two cores busy;
# 3. every course notebook executed in the smoke profile by nbval, NBVAL_WORKERS notebooks at a time (each notebook
#    stays in one kernel, the longest first: dlo.course.nbval_plugin); OMP_WAIT_POLICY=PASSIVE keeps the OpenMP
#    threads of one from spinning while another computes. It runs after the rehearsals on purpose: the smoke and dry
#    profiles compile the same graphs (Jour 1's torch.compile step, jit), and the second finds them in Inductor's
#    cache (.cache/torchinductor). Stages 2 and 3 run as one session of three workers measured 3 min longer on 2
#    cores: both compiled cold at the same time, and the machine had no idle time left to fill;
# 4. every sentence the notebooks wrote about a measured outcome, derived again from their fresh results.json
#    (tests/test_conclusions.py), and the claims pinned in tests/test_prose_claims.py read on those results.
# Each test worker (and each process it starts, unless it sets its own) gets cores / workers threads
# (OMP_NUM_THREADS; at least 1): workers that each use every core fight for them, and on small tensors the extra
# threads cost more than they give (measured on 2 cores: nbval of four notebooks 15 % sooner with one thread each).
# Multi-process runs fork their ranks from a Python that has already imported torch (DLO_LAUNCHER=fork,
# dlo.runtime.launch): started by torchrun, each rank would spend seconds importing torch, and the notebooks and tests
# start hundreds of ranks. torchrun itself, what students and batch jobs use, is tested by tests/test_launcher.py and
# tests/test_jour2.py, which set it back.
NBVAL_WORKERS ?= 2
TEST_WORKERS ?= 2
REHEARSAL_WORKERS ?= 3
# the cores this process may use (nproc alone would obey an OMP_NUM_THREADS already set)
CORES := $(shell env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)
threads_per = $(shell echo $$(( $(CORES) / $(1) > 1 ? $(CORES) / $(1) : 1 )))
test: $(STAMP)
	OMP_NUM_THREADS=$(call threads_per,$(TEST_WORKERS)) DLO_LAUNCHER=fork \
	    $(VENV)/bin/python -m pytest tests --ignore=tests/test_wrong_answers.py --ignore=tests/test_dry_profiles.py \
	    -n $(TEST_WORKERS) --dist loadfile --durations=20 $(PYTEST_ARGS)
	OMP_NUM_THREADS=$(call threads_per,$(REHEARSAL_WORKERS)) OMP_WAIT_POLICY=PASSIVE DLO_LAUNCHER=fork DLO_DRY_PROFILES=1 \
	    $(VENV)/bin/python -m pytest tests/test_dry_profiles.py tests/test_wrong_answers.py -q -n $(REHEARSAL_WORKERS) \
	    --dist load --maxschedchunk 1 --durations=25 $(PYTEST_ARGS)
	OMP_NUM_THREADS=$(call threads_per,$(NBVAL_WORKERS)) OMP_WAIT_POLICY=PASSIVE DLO_LAUNCHER=fork \
	    DLO_RUNS_DIR=$(CURDIR)/runs/nbval $(VENV)/bin/python -m pytest --nbval-lax \
	    --nbval-kernel-name dlo -p no:cacheprovider -p dlo.course.nbval_plugin -n $(NBVAL_WORKERS) \
	    --durations=15 $$($(PY) -c "from dlo.course.notebooks import source_notebooks; print(' '.join(str(p) for p in source_notebooks()))") $(PYTEST_ARGS)
	DLO_RUNS_DIR=$(CURDIR)/runs/nbval $(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_conclusions.py tests/test_prose_claims.py

# Every notebook's full profile rehearsed on a CPU (profile "dry": the full lists and branches, sizes scaled down),
# each in its own Python (dlo run --engine plain), alone: the second stage of `make test` runs them with the corpus.
test-dry: $(STAMP)
	OMP_NUM_THREADS=$(call threads_per,$(REHEARSAL_WORKERS)) OMP_WAIT_POLICY=PASSIVE DLO_DRY_PROFILES=1 \
	    $(VENV)/bin/python -m pytest tests/test_dry_profiles.py -q -p no:cacheprovider \
	    -n $(REHEARSAL_WORKERS) --dist load --maxschedchunk 1 --durations=25 $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest tests -m "not slow and not notebook" $(PYTEST_ARGS)

# A student's session in a real browser (tests/test_browser.py): JupyterLab in headless Chromium runs a student
# notebook to its first check, types the solution, reads PASSED, checks the tqdm widget and a figure. Not part of
# `make test`. Needs Chromium from the system (Debian: apt-get install chromium; or DLO_CHROMIUM=/path/to/chrome)
# and the playwright package, an optional extra installed here into .venv (its own browser download is not used).
PLAYWRIGHT ?= playwright==1.65.2
test-browser: $(STAMP)
	$(PY) -c "import playwright" 2>/dev/null || $(PY) -m pip install -q "$(PLAYWRIGHT)"
	DLO_BROWSER_TEST=1 $(VENV)/bin/python -m pytest tests/test_browser.py -v -p no:cacheprovider $(PYTEST_ARGS)

# A GPU node's environment: the torch the GPU nodes have (2.11, with torchvision 0.26), in a second venv holding only
# what such a node has: torch, torchvision, transformers, matplotlib, pandas, tqdm, tensorboard (no IPython, Jupyter,
# papermill, DeepSpeed, Ray or Optuna: their tests skip). There, the library and distributed tests, then every
# notebook's dry profile through the plain engine (`dlo run --engine plain`, what such a node runs; a notebook that
# imports a package the node lacks, e.g. Optuna, is skipped and says so). PyPI's torch 2.11 is a CUDA build
# (~4.5 GB); it runs on the CPU. Not part of `make test` (first run: a few minutes of download).
COMPAT_VENV ?= $(CACHE)/venv-compat
COMPAT_TORCH ?= torch==2.11.0 torchvision==0.26.0
COMPAT_TESTS ?= tests/test_fsdp.py tests/test_fsdp_prefetch.py tests/test_pipeline.py tests/test_p2p_replay.py tests/test_tp.py tests/test_ddp.py \
	tests/test_llama.py tests/test_jit.py tests/test_models.py tests/test_grid.py tests/test_gpu_check.py \
	tests/test_layers.py tests/test_train.py tests/test_resume_switches.py tests/test_security.py tests/test_bench.py \
	tests/test_augment.py tests/test_memory.py tests/test_launcher.py tests/test_context.py tests/test_experts.py tests/test_attention.py \
	tests/test_zero_bubble.py tests/test_grid_capstone.py tests/test_sequence_parallel.py tests/test_apis.py tests/test_race.py
test-compat:
	test -x $(COMPAT_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install -q $(COMPAT_TORCH)
	$(COMPAT_VENV)/bin/python -m pip install -q $$(grep -E '^(numpy|pandas|matplotlib|tqdm|psutil|pillow|pytest|pytest-xdist|hypothesis|transformers|tensorboard)==' requirements.txt)
	$(COMPAT_VENV)/bin/python -m pip install -q --no-deps -e .
	$(COMPAT_VENV)/bin/python -c "import torch; assert torch.__version__.startswith('2.11'), torch.__version__"
	$(COMPAT_VENV)/bin/python -c "import importlib.util as u, sys; \
	    extra = [m for m in ('IPython', 'ipykernel', 'nbformat', 'papermill', 'jupyter_client') if u.find_spec(m)]; \
	    sys.exit(f'{extra} installed in $(COMPAT_VENV): not a GPU node' if extra else 0)"
	$(COMPAT_VENV)/bin/python -m pytest $(COMPAT_TESTS) -p no:cacheprovider $(PYTEST_ARGS)
	OMP_NUM_THREADS=$(call threads_per,$(REHEARSAL_WORKERS)) OMP_WAIT_POLICY=PASSIVE DLO_DRY_PROFILES=1 DLO_LAUNCHER=fork \
	    $(COMPAT_VENV)/bin/python -m pytest tests/test_dry_profiles.py -q -p no:cacheprovider \
	    -n $(REHEARSAL_WORKERS) --dist load --maxschedchunk 1 $(PYTEST_ARGS)

# Every full-profile benchmark on this GPU node (results/README.md). It runs with whatever Python has torch: the
# venv when there is one, else $(PYTHON) (a cluster module), so that no pip install is needed on the node.
GPU_CHECK_ARGS ?=
gpu-check:
	PYTHONPATH=$(CURDIR)/lib $(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m dlo gpu-check $(GPU_CHECK_ARGS)

student: $(STAMP)
	$(VENV)/bin/dlo student

check-student: $(STAMP)
	$(VENV)/bin/dlo student --check

# JupyterLab's terminals and `!` commands inherit its PATH: the venv's bin first, so `dlo hint ...` works there.
lab: install
	PATH='$(VENV_BIN)':"$$PATH" $(VENV)/bin/jupyter lab

clean:
	rm -rf runs .cache .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) lib/*.egg-info
