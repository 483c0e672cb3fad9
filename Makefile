# flyship: `make demo` and `make test` do all set-up on a fresh Debian 12 machine.
#   FLYDSL_PY   - the build Python (FlyDSL 0.5.0 + Triton 3.6 + torch CPU): runs flyc-build
#   WORKLOAD_PY - the workload Python (torch + ninja, never flydsl): runs the loader
PY          ?= python3.11
FLYDSL_VENV ?= .venv-flydsl
WORKLOAD_VENV ?= .venv-workload
FLYDSL_PY   ?= $(FLYDSL_VENV)/bin/python
WORKLOAD_PY ?= $(WORKLOAD_VENV)/bin/python
TORCH_PIN   ?= torch==2.13.0
ARCHS       ?= gfx942 gfx950
JOBS        ?= 2
BUNDLE      ?= artifacts/examples
TRITON_BUNDLE ?= artifacts/triton
SUDO        := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PKGS    := llvm-22 lld-22 clang-22 rocm-device-libs libamdhip64-dev
STAMP       := .dev

export FLYSHIP_TEST_FLYDSL_PY := $(abspath $(FLYDSL_PY))

# The FlyDSL version matrix (tests/matrix): "<python>:<flydsl release>" cells, one cached venv each under
# MATRIX_DIR (a base venv per Python holds torch + numpy; a FlyDSL venv per release layers over it).
# The last patch of each minor PyPI serves, on two Pythons. Python 3.11 takes the CPU torch on this machine's
# disk; 3.12 gets PyPI's (CUDA) torch with its nvidia-* packages (~5.5 GB, once): it imports on the CPU.
MATRIX_DIR  ?= $(HOME)/.cache/flyship-matrix/venvs
PY311       ?= $(shell command -v python3.11 2>/dev/null)
PY312       ?= $(shell python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null || ls $(HOME)/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -1)
FLYDSL_RELEASES ?= 0.1.5 0.2.4 0.3.4.1 0.4.2 0.5.0
MATRIX      ?= $(foreach v,$(FLYDSL_RELEASES),$(PY311):$(v)) $(if $(PY312),$(foreach v,$(FLYDSL_RELEASES),$(PY312):$(v)))

.PHONY: all setup apt venvs install wheel demo test test-build test-workload test-hostile test-matrix bundles gpu-check clean

all: demo

$(STAMP):
	mkdir -p $(STAMP)

# Debian packages pip has no equivalent for: LLVM 22 (knows gfx950; llvm-mc, ld.lld,
# clang-offload-bundler), the AMDGPU device bitcode FlyDSL links against, HIP headers + libamdhip64.
apt: $(STAMP)/apt.stamp
$(STAMP)/apt.stamp: | $(STAMP)
	@if [ -x /usr/lib/llvm-22/bin/llvm-mc ] && [ -d /usr/lib/x86_64-linux-gnu/amdgcn/bitcode ] \
	   && [ -f /usr/include/hip/hip_runtime_api.h ]; then echo "apt: packages present"; \
	 else $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(APT_PKGS); fi
	touch $@

$(FLYDSL_VENV)/.ok:
	$(PY) -m venv $(FLYDSL_VENV)
	$(FLYDSL_PY) -m pip install -q --upgrade pip
	$(FLYDSL_PY) -m pip install -q $(TORCH_PIN)
	$(FLYDSL_PY) -m pip install -q -r requirements/build.txt
	touch $@

$(WORKLOAD_VENV)/.ok:
	$(PY) -m venv $(WORKLOAD_VENV)
	$(WORKLOAD_PY) -m pip install -q --upgrade pip
	$(WORKLOAD_PY) -m pip install -q $(TORCH_PIN)
	$(WORKLOAD_PY) -m pip install -q -r requirements/workload.txt
	touch $@

venvs: $(FLYDSL_VENV)/.ok $(WORKLOAD_VENV)/.ok

# flyship itself goes into both Pythons as an editable install of this checkout (setup.py maps the source
# folders onto the one import name; pure Python, csrc/ found beside loader/), the checkout root first on their
# sys.path so that the clone folder never shadows it (scripts/dev_install.sh says why).
install: apt venvs
	sh scripts/dev_install.sh $(FLYDSL_PY)
	sh scripts/dev_install.sh $(WORKLOAD_PY)

setup: install

# flyship is on no package index: a wheel of this checkout (pure Python, one for every machine), which
# `pip install --find-links dist "flyship[compiler]"` / `... flyship` install by name (README, "Installing").
# PY needs pip (Debian: python3-pip), or use a venv's: make wheel PY=.venv-workload/bin/python.
wheel:
	rm -rf build *.egg-info
	$(PY) -m pip wheel -q --no-deps -w dist .
	rm -rf build *.egg-info

# The main job end to end: build the FlyDSL example bundle for gfx942 + gfx950 in the FlyDSL Python,
# then load it in the workload Python (no flydsl there) and show the handoff.
demo: install
	$(FLYDSL_VENV)/bin/flyc-build examples/flydsl/ops.py -o $(BUNDLE) $(addprefix --arch ,$(ARCHS)) \
	    -j $(JOBS) --force --offload-bundle
	$(WORKLOAD_PY) examples/demo_workload.py $(BUNDLE)

bundles: install
	$(FLYDSL_VENV)/bin/flyc-build examples/flydsl/ops.py -o $(BUNDLE) $(addprefix --arch ,$(ARCHS)) -j $(JOBS) --force
	$(FLYDSL_VENV)/bin/flyc-build examples/triton/ops.py -o $(TRITON_BUNDLE) --arch sm_90 --arch gfx942 -j $(JOBS) --force
	$(FLYDSL_VENV)/bin/flyc-build examples/triton/training.py -o artifacts/training --arch sm_90 -j $(JOBS) --force

# Tests are tiered: `compile` (FlyDSL + Triton + LLVM; runs in the build Python), `cpu`/`hip`/`hipnv` (workload
# Python), `gpu` (skipped here with the reason), `matrix` (make test-matrix). The workload tier builds the bundles it
# needs through flyc-build. These three expressions and the recipes that run them are the one statement of the tiers:
# tests/test_tiers.py reads them here and fails when a test is selected by no tier in a Python that can import it.
TIER_COMPILE  := compile
TIER_WORKLOAD := not compile and not matrix
TIER_MATRIX   := matrix

test: install
	$(FLYDSL_PY) -m pytest -m "$(TIER_COMPILE)" tests
	$(WORKLOAD_PY) -m pytest -m "$(TIER_WORKLOAD)" tests

# The hostile suite alone (part of `make test`'s workload tier): the readers' explicit hostile inputs and the
# reader fuzz (FLYSHIP_FUZZ_CASES per reader, default 10000), every case in a child process under a memory and
# a time limit; prints the tallies.
test-hostile: install
	$(WORKLOAD_PY) -m pytest -m "$(TIER_WORKLOAD)" tests/hostile

# The version matrix: each cell builds examples/flydsl_portable for gfx942 + gfx950 in its own venv; the
# workload Python loads every bundle (oldest and newest side by side) and checks the kernarg packing; and a
# fresh venv made as the README says (pip install ".[compiler]" next to FlyDSL 0.1.5) keeps its FlyDSL.
test-matrix: install
	FLYSHIP_MATRIX="$(strip $(MATRIX))" FLYSHIP_MATRIX_DIR=$(MATRIX_DIR) FLYSHIP_MATRIX_TORCH_PY311=$(TORCH_PIN) \
	    $(WORKLOAD_PY) -m pytest -m "$(TIER_MATRIX)" tests/matrix

gpu-check:
	bash scripts/gpu_check.sh $(TRITON_BUNDLE)

clean:
	rm -rf build dist *.egg-info $(BUNDLE) $(TRITON_BUNDLE) .pytest_cache

distclean: clean
	rm -rf $(FLYDSL_VENV) $(WORKLOAD_VENV) $(STAMP)
