# distlab: `make lab` to open the course, `make test` to check it. Everything installs into .venv.
#
# Set-up is split into stamp files inside .venv, so each step runs once and is redone only when
# its input changes (edit requirements/lock.txt and the next make re-installs the dependencies).
#
# Installs never drift: every package comes at the version in requirements/lock.txt (written by
# `make lock`, on purpose), never at whatever was released this morning. `make test-latest` tries
# the newest releases pyproject.toml allows, in a venv of its own, before anyone locks them.

PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
# The course machine's pip configuration caps torch at 2.14.1 (a constraint file in /etc/xdg/pip,
# because 2.14.1 lies on its disk). This project's own pip calls lift that cap for themselves
# (PIP_CONSTRAINT, read before any configuration file) and change no file outside the project; the
# lock is their only constraint. Elsewhere this changes nothing.
NO_CAP := PIP_CONSTRAINT=/dev/null
PIP := $(NO_CAP) $(VPY) -m pip
# torch is pinned here and installed first; everything else, torch's dependencies included, is in
# the lock. pip itself and uv (which only `make lock` uses) are pinned too. distlab/_torch.py's
# LOCKED names the same release (a test keeps the two equal).
TORCH := torch==2.15.0
PIP_VERSION := 26.3
UV_VERSION := 0.13.9
LOCK := requirements/lock.txt
# Older releases tested beside the locked ones (tests/test_ship.py): unpacked into .venv/compat.
COMPAT := requirements/compat.txt
# Extra pytest arguments, e.g.  make test PYTEST_ARGS="-k launch -x"
PYTEST_ARGS ?=
# The test runs' pytest-xdist workers. The suite spends much of its time waiting (on ranks that
# start, kernels that boot, hangs on purpose that must time out): two workers share 2 cores well
# (a file's tests stay together on one worker, --dist loadfile: a notebook's cells in order, a
# module's fixtures once). `make test TEST_WORKERS=1` runs one process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

.PHONY: setup lab site test test-side test-spawn test-cpu-kernels test-cpu-threads test-latest test-torch \
  torch-venv test-previous previous-venv notebooks lock \
  lint clean

setup: $(VENV)/.stamp-deps $(VENV)/.stamp-compat $(VENV)/.stamp-kernel $(VENV)/.stamp-browser

# torch first, with exactly this pin: the plain `torch` requirement in pyproject.toml is then
# already satisfied, and pip does not download gigabytes of CUDA wheels. The lock constrains the
# packages torch pulls in (sympy, networkx, ...).
$(VENV)/.stamp-torch: $(LOCK)
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(PIP) install -q pip==$(PIP_VERSION)
	$(PIP) install -q $(TORCH) -c $(LOCK)
	touch $@

# Everything else at its locked version, then distlab itself (editable, built with the locked
# setuptools: no build environment fetching the newest one). `pip check` fails if pyproject.toml
# needs something the lock does not give: run `make lock` then.
$(VENV)/.stamp-deps: $(VENV)/.stamp-torch pyproject.toml $(LOCK)
	$(PIP) install -q -r $(LOCK)
	$(PIP) install -q --no-deps --no-build-isolation -e .
	$(PIP) check || { echo "pyproject.toml and $(LOCK) disagree: run make lock"; exit 1; }
	touch $@

$(VENV)/.stamp-compat: $(VENV)/.stamp-deps $(COMPAT)
	@grep -v '^\s*#' $(COMPAT) | grep '==' | while read -r req; do \
	  name=$${req%%==*}; version=$${req##*==}; \
	  $(PIP) install -q --no-deps --upgrade --target $(VENV)/compat/$$name-$$version "$$req" \
	    || exit 1; \
	done
	touch $@

# A kernel spec named python3 that runs this venv's Python, so notebooks run with distlab and torch
# from .venv whichever Jupyter starts them.
$(VENV)/.stamp-kernel: $(VENV)/.stamp-deps
	$(VPY) -m ipykernel install --sys-prefix --name python3
	touch $@

# The browser test drives JupyterLab in Debian's Chromium (Playwright's own browser download does
# not work offline). Installed once if missing; without root or apt the browser test is skipped.
$(VENV)/.stamp-browser: $(VENV)/.stamp-deps
	@if ! command -v chromium >/dev/null 2>&1; then \
	  SUDO=; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
	  ($$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium) \
	    || echo "warning: could not install chromium; the browser test will be skipped"; \
	fi
	touch $@

# Resolve every dependency anew, at the newest versions pyproject.toml allows, into the lock.
# On purpose only: run `make test-latest` first, then `make lock`, `make test`, and commit.
lock: $(VENV)/.stamp-torch
	$(PIP) install -q uv==$(UV_VERSION)
	$(VPY) requirements/lock.py --uv $(VENV)/bin/uv

# Loopback only: the server runs code for whoever reaches it.
# Jupyter refuses to run as root (containers, cloud VMs) unless told it may.
# `make lab NOTEBOOK=25_at_scale_on_a_laptop.ipynb` opens that notebook at once.
NOTEBOOK ?=
lab: setup
	$(VPY) -m jupyter lab --notebook-dir=notebooks --ServerApp.ip=127.0.0.1 \
	  $$( [ "$$(id -u)" -eq 0 ] && echo --allow-root ) $(if $(NOTEBOOK),notebooks/$(NOTEBOOK))

# The course as a static website in site/ (open site/index.html), from the notebooks as stored:
# nothing is run and nothing fetched (website/build.py; tests/test_site.py checks it in Chromium).
site: $(VENV)/.stamp-deps
	$(VPY) website/build.py --out site

# Options live in pyproject.toml: unit tests plus every notebook re-run and compared (nbval),
# then notebooks again on the spawn path (what a Mac runs: a fresh interpreter per rank), with
# other thread counts, and on the torch release before the locked one.
# The first part runs under ATen's portable kernels (ATEN_CPU_CAPABILITY=default), what another
# CPU prints (see test-cpu-kernels): the stored outputs were made with this machine's own
# kernels, so every notebook is compared across two kinds of CPU in one run.
# The other parts (test-side: installing the previous torch, the spawn path, the thread counts,
# the previous torch's tests) run beside the first, on the cores it leaves idle while it waits on
# ranks and kernels; their output follows the first part's (kept in .venv/test-side.log).
# Torch threads: each of the first part's workers takes its share of the cores (conftest.py), and
# the other parts, beside them, one (OMP_NUM_THREADS=1; test-cpu-threads sets its own).
# pytest's exit status 5 means "no tests collected", which is not a failure here.
# DISTLAB_HOME: where distlab keeps what a learner saves (notebook 08's fit); the tests use
# their own, so that `make test` never overwrites yours.
TEST_HOME := $(CURDIR)/.venv/test-home
SIDE_LOG := $(VENV)/test-side.log
test: setup
	@OMP_NUM_THREADS=1 $(MAKE) --no-print-directory test-side TEST_WORKERS=1 > $(SIDE_LOG) 2>&1 & side=$$!; \
	echo "DISTLAB_HOME=$(TEST_HOME) ATEN_CPU_CAPABILITY=default $(VPY) -m pytest $(XDIST) --durations=25 $(PYTEST_ARGS)"; \
	echo "(and beside it: make test-side, its output below when both are done)"; \
	DISTLAB_HOME="$(TEST_HOME)" ATEN_CPU_CAPABILITY=default $(VPY) -m pytest $(XDIST) --durations=25 \
	  $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; \
	wait $$side; side_rc=$$?; \
	echo "==================== make test-side (ran beside the above) ===================="; \
	grep -v "^WARNING: Location" $(SIDE_LOG); \
	if [ $$side_rc -ne 0 ]; then echo "make test-side failed"; fi; \
	[ $$rc -eq 0 ] && [ $$side_rc -eq 0 ]

# What `make test` runs beside its first part, one after another and on one worker (the first
# part has two): the spawn path's core notebooks, the other thread counts, the previous torch
# (its venv installed first).
test-side: setup
	$(MAKE) --no-print-directory previous-venv
	$(MAKE) --no-print-directory test-spawn SPAWN_NOTEBOOKS="$(SPAWN_CORE)"
	$(MAKE) --no-print-directory test-cpu-threads \
	  CPU_FOUR_THREAD_NOTEBOOKS="$(MAKE_TEST_FOUR_THREADS)"
	$(MAKE) --no-print-directory test-previous

# The notebooks as a Mac runs them (DISTLAB_START_METHOD=spawn: a fresh interpreter per rank),
# compared strictly too. `make test-spawn` runs all of them (slow: every rank imports torch
# anew). `make test` runs the four that cover every spawn-path behaviour:
# launches, a cluster, the stop button and hangs with short timeouts (00), RPC (12), debugging
# stuck ranks (18), a 4-rank cluster with DTensor, FSDP and DCP (24). (02's and 11's hangs are
# 00's kind, 14's DTensor and FSDP are in 24; 25 runs its simulated ranks in the kernel, where the
# start method plays no part.)
SPAWN_CORE := $(addprefix notebooks/,00_launching_from_a_notebook.ipynb \
  12_rpc_basics.ipynb 18_debugging_distributed_jobs.ipynb 24_capstone_2d_parallel.ipynb)
SPAWN_NOTEBOOKS ?= notebooks
test-spawn: setup
	DISTLAB_HOME="$(TEST_HOME)" DISTLAB_START_METHOD=spawn $(VPY) -m pytest $(XDIST) \
	  --durations=10 $(SPAWN_NOTEBOOKS)

# The notebooks whose numbers come from float arithmetic again, the way other laptops run them,
# under three configurations a learner's machine really has (none sets oneDNN or MKL switches):
#  - ATen's portable kernels (ATEN_CPU_CAPABILITY=default: another vector unit, as on Apple
#    silicon) with the machine's own threads: every such notebook (08-10, 12, 16: the first
#    losses and averaged gradients; 19-24, 26, 27: Part III). 02, 05 and 07 print bit patterns,
#    RNG draws and exact fractions; 25's numbers are bytes and counts of simulated ranks.
#  - One thread (kernel and ranks; this machine's own kernels): where the kernel itself computes
#    in floats (19's autocast GPT, 22's attention blocks). Here ranks have 1 thread anyway.
#  - Four threads in the kernel and in every rank (DISTLAB_THREADS: what ranks get on an 8-core
#    laptop), portable kernels: the notebooks whose ranks reduce large tensors (21, 24, 26, 27)
#    and 19.
# About 20 notebook runs. `make test` runs the second configuration, and the third on 19, 21 and
# 27 (MAKE_TEST_FOUR_THREADS; 24 and 26, whose ranks' reductions 21 and 27 share, only here):
# its first phase is the first configuration. A stored output that depends on the CPU (the
# digits of a rounding error, a count at the edge of fp16's range) fails here: print the bound it
# meets instead (distlab.below, distlab.above). `make test` runs it.
CPU_NB = $(wildcard $(foreach n,$(1),notebooks/$(n)_*.ipynb))
CPU_KERNELS_PYTEST = DISTLAB_HOME="$(TEST_HOME)" $(VPY) -m pytest $(XDIST) --durations=5
CPU_KERNEL_NOTEBOOKS ?= $(call CPU_NB,08 09 10 12 16 19 20 21 22 23 24 26 27)
CPU_ONE_THREAD_NOTEBOOKS ?= $(call CPU_NB,19 22)
CPU_FOUR_THREAD_NOTEBOOKS ?= $(call CPU_NB,19 21 24 26 27)
test-cpu-kernels: setup
	ATEN_CPU_CAPABILITY=default $(CPU_KERNELS_PYTEST) $(CPU_KERNEL_NOTEBOOKS)
	$(MAKE) --no-print-directory test-cpu-threads

# The second and third configurations only: `make test`'s first phase already ran every notebook
# under the portable kernels with the machine's own threads.
test-cpu-threads: setup
	OMP_NUM_THREADS=1 DISTLAB_THREADS=1 $(CPU_KERNELS_PYTEST) $(CPU_ONE_THREAD_NOTEBOOKS)
	ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=4 DISTLAB_THREADS=4 $(CPU_KERNELS_PYTEST) \
	  $(CPU_FOUR_THREAD_NOTEBOOKS)

MAKE_TEST_FOUR_THREADS = $(call CPU_NB,19 21 27)

# Other torch releases, each in a venv of its own; nothing here touches .venv or the lock. Stored
# outputs were made with $(TORCH): on another release the notebooks' first line (the versions)
# differs by design, so these runs compare with that line's torch release masked
# (notebooks/sanitize-other-torch.cfg, added to sanitize.cfg for these runs only).
OTHER_SANITIZE = cat notebooks/sanitize.cfg notebooks/sanitize-other-torch.cfg $(OTHER_SANITIZE_EXTRA) \
  > $(1)/sanitize.cfg
OTHER_PYTEST = DISTLAB_HOME="$(CURDIR)/$(1)/test-home" $(1)/bin/python -m pytest -p no:cacheprovider \
  $(XDIST) --nbval-sanitize-with $(1)/sanitize.cfg --durations=10

# The newest torch and the newest releases pyproject.toml allows: the unit tests and the whole
# series, so that maintainers meet the next release before learners do. Run it before refreshing
# the lock, before a workshop, and once a month; it prints what differs from the lock. pip on the
# course machine is capped at torch 2.14.1 (PIP_CONSTRAINT in its config): lifted in this venv's
# installs only. `make test-latest LATEST_NOTEBOOKS="notebooks/0*.ipynb"` for fewer notebooks.
LATEST := .venv-latest
LATEST_NOTEBOOKS ?= notebooks
test-latest:
	test -x $(LATEST)/bin/python || $(PY) -m venv $(LATEST)
	PIP_CONSTRAINT=/dev/null $(LATEST)/bin/python -m pip install -q --upgrade pip
	PIP_CONSTRAINT=/dev/null $(LATEST)/bin/python -m pip install -q --upgrade torch
	PIP_CONSTRAINT=/dev/null $(LATEST)/bin/python -m pip install -q --upgrade --upgrade-strategy eager \
	  -e ".[dev]"
	$(LATEST)/bin/python requirements/lock.py --diff
	$(call OTHER_SANITIZE,$(LATEST))
	$(call OTHER_PYTEST,$(LATEST)) tests $(LATEST_NOTEBOOKS)

# An older (or any other) torch release with everything else from the lock: the unit tests, so that
# a learner whose torch is older is not stranded (`make test-torch TORCH_VERSION=2.13.0`), and the
# notebooks too with `OTHER_NOTEBOOKS=notebooks`. The lock's CUDA libraries belong to $(TORCH)'s
# build and are left out: the release asked for brings its own.
TORCH_VERSION ?= 2.13.0
OTHER_TESTS ?= tests
OTHER_NOTEBOOKS ?=
OTHER := .venv-torch-$(TORCH_VERSION)
OTHER_PIP := $(NO_CAP) $(OTHER)/bin/python -m pip
test-torch: torch-venv
	$(call OTHER_SANITIZE,$(OTHER))
	$(call OTHER_PYTEST,$(OTHER)) $(OTHER_TESTS) $(OTHER_NOTEBOOKS)

# The venv of test-torch, installed (or brought up to date) and nothing run.
torch-venv:
	test -x $(OTHER)/bin/python || $(PY) -m venv $(OTHER)
	$(OTHER_PIP) install -q pip==$(PIP_VERSION)
	grep -vE '^(nvidia-|cuda-|triton)' $(LOCK) > $(OTHER)/lock.txt
	$(OTHER_PIP) install -q torch==$(TORCH_VERSION) -c $(OTHER)/lock.txt
	$(OTHER_PIP) install -q -r $(OTHER)/lock.txt
	$(OTHER_PIP) install -q --no-deps --no-build-isolation -e .

# The release before the locked one, every `make test`: the tests of everything that reaches behind
# the torch door (distlab/_torch*.py, scale/ with its pipeline replay, the simulated ranks) and the
# two notebooks built on them, under strict nbval, in a venv of its own (.venv-torch-2.14.1). torch's
# private APIs move every release: a move shows here, in CI, before a learner meets it. On the
# course machine 2.14.1 installs from its disk in seconds; elsewhere it is a download like
# `make setup`'s. `make test PREVIOUS_TORCH=` skips it. The 405B replay of every microbatch (the
# costliest simulation, about 100 s) runs on the locked torch only: every schedule's replay is
# checked on both releases on a small model.
PREVIOUS_TORCH ?= 2.14.1
PREVIOUS_TESTS := tests/test_torch.py tests/test_torch_simulation.py tests/test_scale.py \
  tests/test_scale_pipeline.py tests/test_scale_planted.py tests/test_scale_vs_real.py \
  tests/test_scale_moved.py \
  --deselect tests/test_scale_pipeline.py::test_the_papers_implied_layout_replays_as_it_runs
PREVIOUS_NOTEBOOKS := notebooks/25_at_scale_on_a_laptop.ipynb notebooks/26_three_d_mesh.ipynb
previous-venv:
	@if [ -z "$(PREVIOUS_TORCH)" ]; then exit 0; fi; \
	$(MAKE) --no-print-directory torch-venv TORCH_VERSION=$(PREVIOUS_TORCH)

test-previous:
	@if [ -z "$(PREVIOUS_TORCH)" ]; then echo "PREVIOUS_TORCH is empty: skipped"; exit 0; fi; \
	$(MAKE) --no-print-directory test-torch TORCH_VERSION=$(PREVIOUS_TORCH) \
	  OTHER_TESTS="$(PREVIOUS_TESTS)" OTHER_NOTEBOOKS="$(PREVIOUS_NOTEBOOKS)" \
	  OTHER_SANITIZE_EXTRA=notebooks/sanitize-previous-torch.cfg

# Re-execute every notebook in place, top to bottom in a fresh kernel, one at a time so that a
# failure names its notebook. Run this after changing a notebook or distlab, then commit the result.
# `make notebooks NOTEBOOKS="notebooks/19_*.ipynb"` re-runs only those.
NOTEBOOKS ?= notebooks/[0-9]*.ipynb
notebooks: setup
	@for nb in $(NOTEBOOKS); do \
	  if [ ! -e "$$nb" ]; then echo "no notebooks to run"; exit 0; fi; \
	  echo "running $$nb"; \
	  DISTLAB_HOME="$(TEST_HOME)" $(VPY) -m jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=600 --ExecutePreprocessor.kernel_name=python3 "$$nb" \
	    || { echo "FAILED: $$nb"; exit 1; }; \
	done

lint: setup
	$(VPY) -m ruff check distlab tests bench requirements

clean:
	rm -rf $(VENV) $(LATEST) .venv-torch-* *.egg-info build dist
