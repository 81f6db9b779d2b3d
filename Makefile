# `make demo` and `make test` set everything up on a fresh clone: a venv with the pinned CPU
# environment (envs/cpu.txt, constrained by the full lock envs/cpu.lock.txt) and this package.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: env gpu-env scorer-env judge-env demo test test-unit test-e2e lint format dag graphviz chromium profile clean

$(STAMP): envs/cpu.txt envs/cpu.lock.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@echo "installing the pinned CPU environment into $(VENV) (about 2 minutes the first time)"
	$(BIN)/pip install --quiet --disable-pip-version-check -r envs/cpu.txt -c envs/cpu.lock.txt 2>&1 \
		| { grep -v "is ignored: it is neither a file nor a directory" || true; }
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e . 2>&1 \
		| { grep -v "is ignored: it is neither a file nor a directory" || true; }
	touch $@

env: $(STAMP)

# The training environment of the GPU cluster (Linux x86_64, Python 3.11 or 3.12; the README's "GPU
# cluster environment"): every package by its hash from envs/gpu.lock.txt, then this package.
# GPU_LIGER=1 adds the optional liger-kernel (envs/gpu-liger.lock.txt).
GPU_VENV ?= .venv-gpu
GPU_LIGER ?=
gpu-env:
	$(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/pip install --disable-pip-version-check --require-hashes -r envs/gpu.lock.txt \
		$(if $(GPU_LIGER),-r envs/gpu-liger.lock.txt)
	$(GPU_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -e .
	@echo "GPU environment ready: put $(abspath $(GPU_VENV))/bin first on PATH (login node and jobs)"

# The EvalKit scorer's own environment (envs/scorer.txt says why it is separate); then set
# evalkit.python: .venv-scorer/bin/python. norfair's metadata pins numpy<2: installed --no-deps.
SCORER_VENV ?= .venv-scorer
scorer-env:
	$(PYTHON) -m venv $(SCORER_VENV)
	$(SCORER_VENV)/bin/pip install --quiet --disable-pip-version-check -r envs/scorer.txt
	$(SCORER_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps norfair==2.3.0 -e .
	@echo "scorer environment ready: set evalkit.python: $(SCORER_VENV)/bin/python"

# The VLM judge service's environment (GPU nodes; vLLM pulls its own CUDA torch); then set
# reward.judge_python: .venv-judge/bin/python.
JUDGE_VENV ?= .venv-judge
judge-env:
	$(PYTHON) -m venv $(JUDGE_VENV)
	$(JUDGE_VENV)/bin/pip install --quiet --disable-pip-version-check -r envs/judge.txt
	@echo "judge environment ready: set reward.judge_python: $(JUDGE_VENV)/bin/python"

# Each stage as it finishes, training's progress and the report's path: without every job's files and reasons
# (`snakemake --cores 2` shows those) or Snakemake's header.
demo: env
	snakemake --cores 2 --quiet rules host
	@echo "report: $(CURDIR)/results/runs/$$(videogrpo config --run-id)/report/report.html"

# Two pytest runs side by side: the pipeline's tests (e2e and cluster: one demo, in file order, each rerun
# test seeing the state the one before left) and the rest, which use the CPU the pipeline leaves idle. The
# rest's report follows the pipeline's; the exit status fails if any failed. LATE_TESTS are unit-tier files
# with long multi-process runs, taken after the pipeline's tests in its lane, so that both lanes end together
# (measured: the pipeline lane ended 9 minutes before the other when it ran them).
LATE_TESTS ?= tests/test_a14b_workflow.py tests/test_prompts_per_rank.py
UNIT_LOG ?= .pytest-unit.log
# Both runs note every documented command they run in DOC_LEDGER; then tests/doc_commands.py fails on any shell
# command of the README or docs/ that no test ran.
DOC_LEDGER ?= .doc-commands.jsonl
test: env
	rm -f $(DOC_LEDGER); export VIDEOGRPO_DOC_LEDGER=$(CURDIR)/$(DOC_LEDGER); \
	pytest -m "not e2e and not cluster" -p no:cacheprovider $(addprefix --ignore=,$(LATE_TESTS)) \
		> $(UNIT_LOG) 2>&1 & unit=$$!; \
	pipeline=0; pytest -m "e2e or cluster" || pipeline=$$?; \
	late=0; pytest -m "not e2e and not cluster" -p no:cacheprovider $(LATE_TESTS) || late=$$?; \
	rest=0; wait $$unit || rest=$$?; \
	cat $(UNIT_LOG); \
	echo '{"command": ["make", "test"], "env": {}, "returncode": 0, "test": "make test"}' >> $(DOC_LEDGER); \
	docs=0; python tests/doc_commands.py $(DOC_LEDGER) || docs=$$?; \
	echo "make test: pipeline tests exit $$pipeline, late tests exit $$late, the other tests exit $$rest," \
		"documented commands exit $$docs"; \
	test $$pipeline -eq 0 && test $$late -eq 0 && test $$rest -eq 0 && test $$docs -eq 0

lint: env   # also run by `make test` (tests/test_lint.py)
	ruff check .
	ruff format --check .
	snakefmt --check Snakefile workflow/

format: env
	ruff check --fix .
	ruff format .
	snakefmt Snakefile workflow/

test-unit: env
	pytest -m "not e2e and not cluster"

test-e2e: env
	pytest -m e2e

PROFILES_HOME := $(or $(XDG_CONFIG_HOME),$(HOME)/.config)/snakemake

profile:   # once: `snakemake --profile slurm` then finds profiles/slurm of this checkout by name from any directory
	mkdir -p $(PROFILES_HOME)
	ln -sfn $(CURDIR)/profiles/slurm $(PROFILES_HOME)/slurm
	@echo "snakemake --profile slurm now uses $(CURDIR)/profiles/slurm"

graphviz:   # Debian's graphviz for `dot`, where it is missing (needs root, as CI has)
	@command -v dot >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q graphviz >/dev/null; }

chromium:   # Debian's chromium for the report page's browser test, where it is missing (needs root, as CI has)
	@command -v chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }

dag: env graphviz
	snakemake --dag | dot -Tsvg > dag.svg
	snakemake --rulegraph | dot -Tsvg > rulegraph.svg
	@echo "wrote dag.svg and rulegraph.svg"

clean:
	rm -rf results .snakemake
