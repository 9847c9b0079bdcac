# Both targets create .venv when it is missing: torch first (the pinned CPU wheel), then
# the package in editable mode with its extras (demo: dev; test: dev and ray, in one resolve).
# --no-compile: pip would byte-compile all ~21,000 installed modules on one core (about 50 s of
# CPU); the install compiles the ones the commands import instead (PRECOMPILE below).
# --no-build-isolation: the editable build uses the setuptools just installed instead of
# fetching its own into a throw-away environment.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip install --no-compile

.PHONY: demo test venv lint typecheck docs clean prometheus pytest

# PYTHONDONTWRITEBYTECODE=1 (common in container images, and set on this project's machines) makes
# Python compile every module it imports from source, in every process: 1-3 s of each command.
# After an install, byte-compile once the modules the commands import (simulator, solver, CLI,
# training and MLflow), and only those (all ~21,000 would take ~30 s).
define PRECOMPILE
import os, py_compile, sys
import atoll.control.cli, atoll.envs.rollout, atoll.training.train, atoll.training.policy_model
roots = tuple(os.path.realpath(p) + os.sep for p in (sys.prefix, "."))
for m in list(sys.modules.values()):
    f = getattr(m, "__file__", None) or ""
    if f.endswith(".py") and os.path.isabs(f) and os.path.realpath(f).startswith(roots):
        try:
            py_compile.compile(f, doraise=True)
        except (OSError, py_compile.PyCompileError):
            pass
endef
export PRECOMPILE

define install
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip setuptools wheel
	$(PIP) torch==2.13.0
	$(PIP) --no-build-isolation -e '.[$(1)]'
	$(BIN)/python -c "$$PRECOMPILE"
endef

$(STAMP): pyproject.toml
	$(call install,dev)
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/atoll demo

# The control tests run a real Prometheus (Debian's package). Install it when missing and this
# machine allows it (root with apt-get); otherwise warn and let those tests skip. Never fails.
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's prometheus for the control tests"; \
	    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; } \
	      >/tmp/atoll-prometheus-install.log 2>&1 \
	      || echo "warning: apt-get could not install prometheus (see /tmp/atoll-prometheus-install.log); the Prometheus end-to-end tests will skip"; \
	  else \
	    echo "warning: prometheus is not installed and cannot be (needs root and apt-get); the Prometheus end-to-end tests will skip"; \
	  fi; \
	}

typecheck: $(STAMP)
	@mkdir -p build/typecheck/atoll
	@for d in control envs forecast solvers training; do ln -sfn ../../../$$d build/typecheck/atoll/$$d; done
	$(BIN)/mypy

lint: $(STAMP)
	$(BIN)/ruff check .

# The docs site (docs/mkdocs.yml) into build/site; --strict turns a broken link, a page missing
# from the nav or an API object that no longer exists into a failure. The command-line reference
# is generated from the parsers at build time (docs/hooks/cli_reference.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -f docs/mkdocs.yml
	@echo "docs: build/site/index.html"

# The Ray template build is tested against a local Ray instance, so the tests need the ray extra.
# A fresh checkout installs dev and ray together (one resolve and one editable build, not two).
RAY_STAMP := $(VENV)/.installed-ray
TEST_EXTRAS := dev,ray
$(RAY_STAMP): pyproject.toml
	$(call install,$(TEST_EXTRAS))
	@touch $(STAMP) $(RAY_STAMP)

# pytest on every core (pytest-xdist), with ruff, mypy and the docs build beside it: -k runs all
# four to the end, the target fails if any of them failed, and --output-sync prints each one's
# output as one block when it ends.
test: $(RAY_STAMP) prometheus
	@$(MAKE) --no-print-directory -k -j4 --output-sync=target pytest lint typecheck docs

pytest: $(RAY_STAMP)
	$(BIN)/python -m pytest -n auto

clean:
	rm -rf $(VENV) build *.egg-info
