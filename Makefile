# distlab: `make lab` to open the course, `make test` to check it. Everything installs into .venv.
#
# Set-up is split into stamp files inside .venv, so each step runs once and is redone only when
# its input changes (edit pyproject.toml and the next make re-installs the dependencies).

PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
# Extra pytest arguments, e.g.  make test PYTEST_ARGS="-k launch -x"
PYTEST_ARGS ?=

.PHONY: setup lab test test-spawn notebooks lint clean

setup: $(VENV)/.stamp-deps $(VENV)/.stamp-kernel $(VENV)/.stamp-browser

# torch first, with exactly this pin: the plain `torch` requirement in pyproject.toml is then
# already satisfied, and pip does not download gigabytes of CUDA wheels.
$(VENV)/.stamp-torch:
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0
	touch $@

$(VENV)/.stamp-deps: $(VENV)/.stamp-torch pyproject.toml
	$(VPY) -m pip install -q -e ".[dev]"
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

# Loopback only: the server runs code for whoever reaches it.
# Jupyter refuses to run as root (containers, cloud VMs) unless told it may.
lab: setup
	$(VPY) -m jupyter lab --notebook-dir=notebooks --ServerApp.ip=127.0.0.1 \
	  $$( [ "$$(id -u)" -eq 0 ] && echo --allow-root )

# Options live in pyproject.toml: unit tests plus every notebook re-run and compared (nbval),
# then every notebook again on the spawn path (what a Mac runs: a fresh interpreter per rank).
# pytest's exit status 5 means "no tests collected", which is not a failure here.
# DISTLAB_HOME: where distlab keeps what a learner saves (notebook 08's fit); the tests use
# their own, so that `make test` never overwrites yours.
TEST_HOME := $(CURDIR)/.venv/test-home
test: setup
	DISTLAB_HOME=$(TEST_HOME) $(VPY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc
	$(MAKE) --no-print-directory test-spawn SPAWN_NOTEBOOKS="$(SPAWN_CORE)"

# The notebooks as a Mac runs them (DISTLAB_START_METHOD=spawn: a fresh interpreter per rank),
# compared strictly too. `make test-spawn` runs all of them (about 12 minutes on 2 cores: every
# rank imports torch anew). `make test` runs the ones that cover every spawn-path behaviour, so
# that it stays under 20 minutes: launches and hangs with short timeouts (00, 02, 11), RPC (12),
# DTensor and FSDP (14), debugging stuck ranks (18), a 4-rank cluster with DCP (24).
SPAWN_CORE := $(addprefix notebooks/,00_launching_from_a_notebook.ipynb \
  02_point_to_point.ipynb 11_ddp_unused_parameters.ipynb 12_rpc_basics.ipynb \
  14_spmd_devicemesh_dtensor_fsdp.ipynb 18_debugging_distributed_jobs.ipynb \
  24_capstone_2d_parallel.ipynb)
SPAWN_NOTEBOOKS ?= notebooks
test-spawn: setup
	DISTLAB_HOME=$(TEST_HOME) DISTLAB_START_METHOD=spawn $(VPY) -m pytest \
	  --durations=10 $(SPAWN_NOTEBOOKS)

# Re-execute every notebook in place, top to bottom in a fresh kernel, one at a time so that a
# failure names its notebook. Run this after changing a notebook or distlab, then commit the result.
notebooks: setup
	@for nb in notebooks/[0-9]*.ipynb; do \
	  if [ ! -e "$$nb" ]; then echo "no notebooks to run"; exit 0; fi; \
	  echo "running $$nb"; \
	  DISTLAB_HOME=$(TEST_HOME) $(VPY) -m jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=600 --ExecutePreprocessor.kernel_name=python3 "$$nb" \
	    || { echo "FAILED: $$nb"; exit 1; }; \
	done

lint: setup
	$(VPY) -m ruff check distlab tests bench

clean:
	rm -rf $(VENV) *.egg-info build dist
