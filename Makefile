# Two set-up commands, both from a fresh clone with only Python and pip:
#   make demo   - create the environment if missing (Python 3.11, else the newest
#                 supported one found), install, run the seed scenario
#   make test   - the same environments, then the whole suite:
#                 Python 3.11 + newest JAX it gets (0.10.x) and Python 3.12 + newest JAX (0.12.x),
#                 each under both JAX constant pipelines, plus ruff, mypy --strict and the docs;
#                 and the suite alone at the supported floor (jax 0.8.1) and at a release in
#                 between (jax 0.9.2), both pipelines each, both with Python 3.11.
#                 The checks and suite passes run TEST_JOBS at a time (default 2: this project's
#                 CI machine has 2 cores), each pass's output printed whole when it ends.
#   make test-fast - the edit-test loop: Python 3.11, default pipeline, without tests marked slow
#                 or subprocess.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

PYTHON311 ?= $(shell tools/find-python 3.11)
PYTHON312 ?= $(shell tools/find-python 3.12)
VENV311 := .venv-py311
VENV312 := .venv-py312
# make demo runs on any supported Python (pyproject.toml: 3.11 to 3.13): 3.11
# when found, in the environment make test builds (.venv-py311), else the newest
# supported one found, in an environment named after it (.venv-py313, or
# .venv-py312, the one make test's Python 3.12 run uses).
DEMO_PYTHON ?= $(shell tools/find-python 3.11 3.13 3.12)
DEMO_VENV := $(if $(wildcard $(VENV311)/bin/python),$(VENV311),.venv-py$(shell $(DEMO_PYTHON) -c 'import sys; print(*sys.version_info[:2], sep="")' 2>/dev/null))
# The declared JAX floor (pyproject.toml) and one release in between, each in
# its own Python 3.11 environment that runs the pytest suite only.
JAX_FLOOR := 0.8.1
JAX_MIDDLE := 0.9.2
VENVFLOOR := .venv-jax$(subst .,,$(JAX_FLOOR))
VENVMIDDLE := .venv-jax$(subst .,,$(JAX_MIDDLE))
# The pytest and hypothesis entry points: top-level modules beside the package.
PLUGINS := _frozenconst_pytestplugin.py _frozenconst_hypothesis.py
PIP_FLAGS := --quiet --disable-pip-version-check
PYTEST_FLAGS ?= -q -p no:cacheprovider
TEST_JOBS ?= 2
# JAX reads its constant pipeline from this variable at import: 0 is the default
# pipeline, 1 the simplified one. Both set, never left unset: jax 0.12.1 made the
# simplified pipeline its default (unset means the default pipeline up to 0.12.0).
DEFAULT_PIPELINE := env JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS=0
SIMPLIFIED_PIPELINE := env JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS=1
# Tests marked pipeline_independent (static checks, subprocesses that choose the
# pipeline themselves) give the same result under both: run in each
# environment's default-pipeline pass only.
SIMPLIFIED_ONLY_FLAGS := -m "not pipeline_independent"
# JAX's persistent compilation cache, one per environment, shared by that environment's
# passes (tests/conftest.py turns it on for the pytest process where this variable names a
# folder; subprocesses the tests start compile as a user's program does). Most programs a
# pass compiles are the same under both pipelines, so the simplified pass reuses most of the
# default pass's programs from the cache. `make clean` removes it.
# Python 3.12's JAX (0.12.0.1) aborts the process writing a program with a float6 literal to
# the cache (`literal.cc:2746] Unhandled primitive type F6E3M2FN`, a check failure in
# HloModule::ToProto; tests/test_bad_input.py meets one): tests/conftest.py writes no program
# with a float6 type, in every environment.
COMPILE_CACHE = FROZENCONST_TEST_COMPILATION_CACHE=$(CURDIR)/$(1)/compilation-cache

# The suite's passes compile with XLA's backend at optimisation level 0: LLVM's -O0 for
# the machine code XLA's CPU backend generates; XLA's HLO passes (fusion, constant folding, what
# `compiled.as_text()` shows) run as at the default level, and no test reads a time. Most of a
# pass is XLA compiling small programs that each run a few times, so the machine code's
# optimisation costs more than it saves. The doctests (the docs' and docstrings' examples, both
# pipelines) compile at XLA's default level, as users' programs do. A whole pass at the default
# level costs more than one at level 0, even counting the cache that level 0 keeps it from
# sharing (XLA_FLAGS are part of the cache key). A user's own XLA_FLAGS are kept, after it.
QUICK_CODEGEN := XLA_FLAGS="--xla_backend_optimization_level=0 $${XLA_FLAGS:-}"

.PHONY: demo test test-fast jax-own-tests checks lint typecheck docs doctest doctest-wheel doctest-default doctest-simplified \
  doctest-312-default doctest-312-simplified doctest-middle-default doctest-middle-simplified \
  doctest-floor-default doctest-floor-simplified package \
  pytest-311 pytest-311-default pytest-311-simplified pytest-312 pytest-312-default pytest-312-simplified \
  pytest-floor pytest-floor-default pytest-floor-simplified pytest-middle pytest-middle-default \
  pytest-middle-simplified bench bench-compare \
  device device-bundle device-results gpu gpu-bundle gpu-results clean

$(VENV311)/.installed: pyproject.toml
	@test -n "$(PYTHON311)" || { echo "error: no Python 3.11 found; set PYTHON311=/path/to/python3.11" >&2; exit 1; }
	@test -x $(VENV311)/bin/python || $(PYTHON311) -m venv $(VENV311)
	$(VENV311)/bin/python -m pip install $(PIP_FLAGS) --upgrade pip
	$(VENV311)/bin/python -m pip install $(PIP_FLAGS) -e '.[test,integration,lint,docs,bench]'
	@touch $@

$(VENV312)/.installed: pyproject.toml
	@test -x $(VENV312)/bin/python || $(or $(PYTHON312),$(DEMO_PYTHON)) -m venv $(VENV312)
	$(VENV312)/bin/python -m pip install $(PIP_FLAGS) --upgrade pip
	$(VENV312)/bin/python -m pip install $(PIP_FLAGS) -e '.[test,integration,lint]'
	@touch $@

# pip picks the newest integration libraries that declare support for the pinned JAX.
$(VENVFLOOR)/.installed $(VENVMIDDLE)/.installed: pyproject.toml
	@test -n "$(PYTHON311)" || { echo "error: no Python 3.11 found; set PYTHON311=/path/to/python3.11" >&2; exit 1; }
	@test -x $(@D)/bin/python || $(PYTHON311) -m venv $(@D)
	$(@D)/bin/python -m pip install $(PIP_FLAGS) --upgrade pip
	$(@D)/bin/python -m pip install $(PIP_FLAGS) -e '.[test,integration]' \
	  'jax==$(if $(filter $(VENVFLOOR),$(@D)),$(JAX_FLOOR),$(JAX_MIDDLE))' \
	  'jaxlib==$(if $(filter $(VENVFLOOR),$(@D)),$(JAX_FLOOR),$(JAX_MIDDLE))'
	@touch $@

# Any other supported Python, for make demo: the package alone is all the demo needs.
.venv-py%/.installed: pyproject.toml
	@test -n "$(DEMO_PYTHON)" || { echo "error: no supported Python (3.11, 3.12 or 3.13) found; set DEMO_PYTHON=/path/to/python3" >&2; exit 1; }
	@test -x $(@D)/bin/python || $(DEMO_PYTHON) -m venv $(@D)
	$(@D)/bin/python -m pip install $(PIP_FLAGS) --upgrade pip
	$(@D)/bin/python -m pip install $(PIP_FLAGS) -e .
	@touch $@

demo: $(DEMO_VENV)/.installed
	$(DEMO_VENV)/bin/python -m benchmarks.seed --demo

lint: $(VENV311)/.installed
	$(VENV311)/bin/ruff check frozenconst $(PLUGINS) tests benchmarks examples
	$(VENV311)/bin/ruff format --check frozenconst $(PLUGINS) tests benchmarks examples

# The package: mypy --strict and pyright strict (pyproject.toml); benchmarks/:
# mypy --strict (the same configuration). The library author's sample and the
# misuse sample in tests/typing (mypy --strict and pyright standard, no
# ignores) are checked by tests/test_typing.py, in the 3.11 suite.
typecheck: $(VENV311)/.installed
	$(VENV311)/bin/mypy frozenconst $(PLUGINS)
	$(VENV311)/bin/mypy benchmarks
	$(VENV311)/bin/pyright --pythonpath $(VENV311)/bin/python

docs: $(VENV311)/.installed
	@# Not --quiet: it hides the warnings that --strict turns into a failure.
	NO_MKDOCS_2_WARNING=1 $(VENV311)/bin/mkdocs build --strict --site-dir .site

# The examples of README.md, the docs and the docstrings, run as a user runs them: with the
# wheel installed and the frameworks beside it, not this checkout. `doctest-wheel` builds the
# wheel and installs it into $(DOCS_WHEEL) (`pip install --target`); each pass runs from
# there, outside the checkout, with an environment's Python started with `-S`, which reads
# none of the environment's .pth files, the editable install's among them (it puts this
# checkout on sys.path), and PYTHONPATH naming the wheel, then the environment's
# site-packages (JAX, equinox, flax, optax, orbax, ...). An example that imports from the
# checkout (`examples/`) fails here as it fails for a pip user. Every JAX environment,
# under each constant pipeline it has; compiled at XLA's default level, as users' programs are.
DOCS_WHEEL := .docs-wheel
DOCTEST_ARGS := --doctest-glob='*.md' $(CURDIR)/docs $(CURDIR)/README.md --doctest-modules --pyargs frozenconst
# $(1): the environment; $(2): the constant pipeline.
DOCTEST_RUN = cd $(DOCS_WHEEL) && $(2) \
  PYTHONPATH=$(CURDIR)/$(DOCS_WHEEL):$$(echo $(CURDIR)/$(1)/lib/python3.*/site-packages) \
  $(CURDIR)/$(1)/bin/python -S -m pytest $(PYTEST_FLAGS) $(DOCTEST_ARGS)
doctest: doctest-default doctest-simplified doctest-312-default doctest-312-simplified \
  doctest-middle-default doctest-middle-simplified doctest-floor-default doctest-floor-simplified
doctest-wheel: $(VENV311)/.installed
	rm -rf $(DOCS_WHEEL) && mkdir -p $(DOCS_WHEEL)/.build
	$(VENV311)/bin/python -m build --wheel --outdir $(DOCS_WHEEL)/.build . > /dev/null
	$(VENV311)/bin/python -m pip install $(PIP_FLAGS) --no-deps --target $(DOCS_WHEEL) $(DOCS_WHEEL)/.build/*.whl
doctest-default: doctest-wheel $(VENV311)/.installed
	$(call DOCTEST_RUN,$(VENV311),$(DEFAULT_PIPELINE))
doctest-simplified: doctest-wheel $(VENV311)/.installed
	$(call DOCTEST_RUN,$(VENV311),$(SIMPLIFIED_PIPELINE))
doctest-middle-default: doctest-wheel $(VENVMIDDLE)/.installed
	$(call DOCTEST_RUN,$(VENVMIDDLE),$(DEFAULT_PIPELINE))
doctest-middle-simplified: doctest-wheel $(VENVMIDDLE)/.installed
	$(call DOCTEST_RUN,$(VENVMIDDLE),$(SIMPLIFIED_PIPELINE))
doctest-floor-default: doctest-wheel $(VENVFLOOR)/.installed
	$(call DOCTEST_RUN,$(VENVFLOOR),$(DEFAULT_PIPELINE))
doctest-floor-simplified: doctest-wheel $(VENVFLOOR)/.installed
	$(call DOCTEST_RUN,$(VENVFLOOR),$(SIMPLIFIED_PIPELINE))

# Each environment runs the suite twice: with JAX's default constant pipeline
# (variable 0) and with the simplified one, each pass a target of its own
# so that `make -j` runs them side by side.
pytest-311: pytest-311-default pytest-311-simplified
pytest-311-default: $(VENV311)/.installed
	$(DEFAULT_PIPELINE) $(call COMPILE_CACHE,$(VENV311)) $(QUICK_CODEGEN) $(VENV311)/bin/python -m pytest $(PYTEST_FLAGS)
pytest-311-simplified: $(VENV311)/.installed
	$(SIMPLIFIED_PIPELINE) $(call COMPILE_CACHE,$(VENV311)) $(QUICK_CODEGEN) $(VENV311)/bin/python -m pytest $(PYTEST_FLAGS) $(SIMPLIFIED_ONLY_FLAGS)

# Without a Python 3.12 the 3.12 passes are skipped with a warning (an error under CI).
TEST_ENVIRONMENTS := $(VENV311)/.installed $(VENVFLOOR)/.installed $(VENVMIDDLE)/.installed
ifneq ($(PYTHON312)$(wildcard $(VENV312)/bin/python),)
TEST_ENVIRONMENTS += $(VENV312)/.installed
pytest-312: pytest-312-default pytest-312-simplified
pytest-312-default: $(VENV312)/.installed
	$(DEFAULT_PIPELINE) $(call COMPILE_CACHE,$(VENV312)) $(QUICK_CODEGEN) $(VENV312)/bin/python -m pytest $(PYTEST_FLAGS)
pytest-312-simplified: $(VENV312)/.installed
	$(SIMPLIFIED_PIPELINE) $(call COMPILE_CACHE,$(VENV312)) $(QUICK_CODEGEN) $(VENV312)/bin/python -m pytest $(PYTEST_FLAGS) $(SIMPLIFIED_ONLY_FLAGS)
doctest-312-default: doctest-wheel $(VENV312)/.installed
	$(call DOCTEST_RUN,$(VENV312),$(DEFAULT_PIPELINE))
doctest-312-simplified: doctest-wheel $(VENV312)/.installed
	$(call DOCTEST_RUN,$(VENV312),$(SIMPLIFIED_PIPELINE))
else
pytest-312 pytest-312-default pytest-312-simplified doctest-312-default doctest-312-simplified:
	@if [ "$${CI:-}" = "true" ]; then echo "error: no Python 3.12 found under CI; set PYTHON312=/path/to/python3.12" >&2; exit 1; fi
	@echo "warning: no Python 3.12 found; skipping $@, the Python 3.12 + newest JAX run (set PYTHON312=...)" >&2
endif

pytest-floor: pytest-floor-default pytest-floor-simplified
pytest-floor-default: $(VENVFLOOR)/.installed
	$(DEFAULT_PIPELINE) $(call COMPILE_CACHE,$(VENVFLOOR)) $(QUICK_CODEGEN) $(VENVFLOOR)/bin/python -m pytest $(PYTEST_FLAGS)
pytest-floor-simplified: $(VENVFLOOR)/.installed
	$(SIMPLIFIED_PIPELINE) $(call COMPILE_CACHE,$(VENVFLOOR)) $(QUICK_CODEGEN) $(VENVFLOOR)/bin/python -m pytest $(PYTEST_FLAGS) $(SIMPLIFIED_ONLY_FLAGS)

pytest-middle: pytest-middle-default pytest-middle-simplified
pytest-middle-default: $(VENVMIDDLE)/.installed
	$(DEFAULT_PIPELINE) $(call COMPILE_CACHE,$(VENVMIDDLE)) $(QUICK_CODEGEN) $(VENVMIDDLE)/bin/python -m pytest $(PYTEST_FLAGS)
pytest-middle-simplified: $(VENVMIDDLE)/.installed
	$(SIMPLIFIED_PIPELINE) $(call COMPILE_CACHE,$(VENVMIDDLE)) $(QUICK_CODEGEN) $(VENVMIDDLE)/bin/python -m pytest $(PYTEST_FLAGS) $(SIMPLIFIED_ONLY_FLAGS)

# The package as users get it: wheel and sdist built in isolation, their
# metadata checked, the wheel installed (not editable) in a clean environment,
# and part of the suite run against it from outside the checkout.
package: $(VENV311)/.installed
	rm -rf .dist .venv-wheel
	$(VENV311)/bin/python -m build --outdir .dist . > /dev/null
	$(VENV311)/bin/twine check --strict .dist/*
	$(PYTHON311) -m venv .venv-wheel
	.venv-wheel/bin/python -m pip install $(PIP_FLAGS) .dist/*.whl 'pytest>=8' 'hypothesis>=6.100' 'pytest-timeout>=2.3'
	cd .dist && FROZENCONST_WHEEL_TEST=1 $(call COMPILE_CACHE,$(VENV311)) $(QUICK_CODEGEN) ../.venv-wheel/bin/python -m pytest $(PYTEST_FLAGS) \
	  ../tests/test_installed.py ../tests/test_plugins.py ../tests/test_cache.py ../tests/test_host.py ../tests/test_jit.py

# Everything CI runs, TEST_JOBS at a time. The default passes come first, the longest, so
# that the short checks fill the gaps at the end; `--output-sync=target` prints each one's
# output whole when it ends, and the first failure fails `make test` (once the jobs already
# running have ended).
CHECKS := pytest-311-default pytest-floor-default pytest-middle-default pytest-312-default \
  pytest-311-simplified pytest-312-simplified pytest-middle-simplified pytest-floor-simplified \
  package typecheck doctest-default doctest-simplified doctest-312-default doctest-312-simplified \
  doctest-middle-default doctest-middle-simplified doctest-floor-default doctest-floor-simplified docs lint
test:
	$(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target checks
checks: $(CHECKS)
# Within `make test`, an environment's simplified pass (and the wheel's, Python 3.11's JAX)
# starts once its default pass has ended, to find that pass's programs in the compilation
# cache; make runs whatever else is ready meanwhile. Run alone, each target needs nothing.
# And nothing starts before every environment is built: make would otherwise start whatever
# is ready while the others build (the short checks, then a simplified pass), and the longest
# passes, started later, would end last, running alone at the end.
ifneq ($(filter checks,$(MAKECMDGOALS)),)
pytest-311-simplified package: | pytest-311-default
pytest-middle-simplified: | pytest-middle-default
pytest-floor-simplified: | pytest-floor-default
pytest-312-simplified: | pytest-312-default
$(CHECKS): | $(TEST_ENVIRONMENTS)
endif

# The edit-test loop: Python 3.11, the default pipeline, without the tests marked slow
# or subprocess (those that start interpreters: several devices or processes, memory
# growth, the command line; CONTRIBUTING.md says which); `make test` runs everything.
test-fast: $(VENV311)/.installed
	$(DEFAULT_PIPELINE) $(call COMPILE_CACHE,$(VENV311)) $(QUICK_CODEGEN) $(VENV311)/bin/python -m pytest $(PYTEST_FLAGS) -m "not slow and not subprocess"

bench: $(VENV311)/.installed
	$(VENV311)/bin/python -m benchmarks

# The core section's cache hits and frozenconst.jit per call: the frozenconst of
# git revision BASE against the working tree's (within benchmarks/compare.py's 3% bound).
# Not part of bench.
BASE ?= HEAD
bench-compare: $(VENV311)/.installed
	$(VENV311)/bin/python -m benchmarks compare $(BASE)

# On an accelerator (CONTRIBUTING.md, "On an accelerator"). The device tool is no shell
# command: a session calls it. `make device` builds the bundle that call carries (.device/: the
# wheel, the wheels the machine's own index lacks, the commit) and prints the call;
# `tools/device-run` runs there (a TPU or a GPU: the suite on the chip under both pipelines, one
# process at a time, the subprocess tests on the CPU beside it, and the accelerator and anyjit
# sections); `make device-results FROM=<files_at>` brings the sections' files and a summary of the
# suite into docs/results/.
DEVICE_BUNDLE := .device
DEVICE_CALL := run(command="bash tools/device-run", carry=[".device"], timeout_s=600)
# The whole suite under both pipelines, in one session's device time: three calls, one right
# after the other (each goes on where the last stopped; CONTRIBUTING.md, "On an accelerator").
DEVICE_SUITE_1 := run(command="DEVICE_BENCH_S=0 DEVICE_SPLIT=order DEVICE_PASSES=default,simplified bash tools/device-run", carry=[".device"], timeout_s=600)
DEVICE_SUITE_2 := run(command="DEVICE_BENCH_S=0 DEVICE_CPU_LANE=0 DEVICE_SPLIT=order DEVICE_PASSES=simplified,slow-default,slow-simplified bash tools/device-run", carry=[".device"], timeout_s=600)

device-bundle: $(VENV311)/.installed
	$(VENV311)/bin/python tools/device-bundle $(DEVICE_BUNDLE)

device: device-bundle
	@echo
	@echo "The bundle is in $(DEVICE_BUNDLE)/. Now make this device-tool call (it is no shell command):"
	@echo '  $(DEVICE_CALL)'
	@echo "about 11 minutes of device time (the machine's start, then at most 560 s of command);"
	@echo "then, with the files_at folder its reply names:  make device-results FROM=<files_at>"
	@echo "(a run split over several calls, DEVICE_PASSES with shares: FROM=\"<files_at> <files_at> ...\")"
	@echo "The whole suite under both pipelines instead (about 26 minutes of device time), three calls in a row:"
	@echo '  $(DEVICE_SUITE_1)'
	@echo '  $(DEVICE_SUITE_2)'
	@echo '  the second again; then make device-results FROM="<files_at 1> <files_at 2> <files_at 3>"'

device-results:
	@test -n "$(FROM)" || { echo "error: FROM=<the files_at folder of the device run>" >&2; exit 1; }
	python3 tools/device-results $(FROM) docs/results

# JAX's own numerical tests, each file run plain and with its inputs frozen; what fails only
# frozen, in .jax-own-tests/ (CONTRIBUTING.md, "JAX's own tests"). JAX=<a checkout or bare
# clone of jax-ml/jax>. Not part of make test: it needs JAX's sources and about an hour.
jax-own-tests: $(VENV311)/.installed
	@test -n "$(JAX)" || { echo "error: JAX=<a checkout or bare clone of jax-ml/jax>" >&2; exit 1; }
	$(VENV311)/bin/python -m pip install $(PIP_FLAGS) absl-py
	$(VENV311)/bin/python tools/jax-own-tests --jax $(JAX) --out .jax-own-tests

# The names of an earlier release of these targets.
gpu: device
gpu-bundle: device-bundle
gpu-results: device-results

clean:
	rm -rf $(VENV311) $(VENV312) $(wildcard .venv-py3*) $(VENVFLOOR) $(VENVMIDDLE) .venv-wheel .dist $(DOCS_WHEEL) .site .mypy_cache .ruff_cache $(DEVICE_BUNDLE) .jax-own-tests
