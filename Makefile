# One-command entry points for a fresh machine (see README.md).
#   make demo   – set up .venv and run the whole DAG on the offline default (config/demo.yaml)
#   make test   – set up .venv and run the test suite (unit tests + an end-to-end CI-sized DAG),
#                 then its float32 tests again with other CPU kernels
#   make study  – run the full study (config/config.yaml; needs the Hugging Face Hub or local copies)
#   make clean-demo – delete what `make demo` wrote (its outputs, logs/, benchmarks/); keeps .venv
#   make selfcheck  – run the DAG on hand-built models with known answers (config/selfcheck.yaml)
#                     and compare every verdict with the expected one; non-zero on any disagreement
#   make config-doc – rewrite what is written from the config schema: config/README.md's key tables
#                     and the settings fields (src/posmech/settings/schema_fields.py)
#   make docs       – rewrite everything generated: what config-doc writes, the docs' tables of
#                     analyses (README.md, docs/*.md), written from workflow/analyses/*.yaml, and
#                     the docs' blocks of the demo run's numbers, from docs/demo-numbers.json
#   make demo-numbers – after `make demo`: store the run's numbers (results/) in docs/demo-numbers.json
#                     and rewrite the docs' blocks that quote them
PYTHON ?= python3
VENV   ?= .venv
# Snakemake's --cores: every core of the machine (`all`), no more: on a 2-core machine 8
# would start up to 8 jobs at once, each slowed by the others, the demo's trainings among
# them (every other job waits for one); docs/performance.md
CORES  ?= all
BIN    := $(VENV)/bin
# Which PyTorch build `make setup` installs (torch==2.13.0 from requirements.lock).
# TORCH_INDEX is an extra package index searched for torch; a build found there wins over
# PyPI's because its local version label (+cpu, +cu128) sorts above the plain version.
#   CPU build (default):     TORCH_INDEX=https://download.pytorch.org/whl/cpu
#   CUDA 12.8 build:         make setup TORCH_INDEX=https://download.pytorch.org/whl/cu128
#   PyPI's own build:        make setup TORCH_INDEX=   (on Linux x86_64 that is the CUDA build,
#                            which brings ~20 nvidia-* packages, several GB)
# Check what is installed: .venv/bin/python -c "import torch; print(torch.__version__, torch.cuda.is_available())"
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PIN   := $(shell grep -E '^torch==' requirements.lock)

.PHONY: setup demo study test lint format clean-demo selfcheck config-doc docs demo-numbers

$(BIN)/snakemake: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) "$(TORCH_PIN)"
	$(BIN)/pip install --quiet -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

# Byte-compile the environment once.  Where PYTHONDONTWRITEBYTECODE is set (container images
# often set it) pip writes no .pyc files and Python never caches what it compiles, so every
# job would compile torch, pandas and matplotlib from source again: ~3 CPU s more per job,
# ~200 CPU s over the demo DAG (docs/performance.md).  compileall writes the cache whatever
# that variable says, and Python reads it.  A few files of torch's test suite use newer syntax
# and fail to compile (they are never imported): hence `|| true`.
$(VENV)/.bytecode: $(BIN)/snakemake
	$(BIN)/python -m compileall -q -q -j 0 $(VENV)/lib || true
	touch $@

setup: $(BIN)/snakemake $(VENV)/.bytecode

# Each entry point checks its config first (`python -m posmech check-config`, ~1-3 s): a YAML
# syntax error is then named with its file and line (Snakemake's own message, "Config file
# is not valid JSON or YAML", names neither), and every other config problem in one round.
demo: setup
	$(BIN)/python -m posmech check-config config/demo.yaml
	$(BIN)/snakemake --cores $(CORES) --configfile config/demo.yaml

# The self-check (README.md "Self-check"): build the hand-built models (src/posmech/verdicts/selfcheck.py)
# under $(SELFCHECK_DIR)/resources/selfcheck/, run the DAG there (its own working directory:
# the repository's results/ stay untouched), then compare results/report/findings.csv with
# the expected verdicts of the cases (posmech.verdicts.selfcheck.CASES; exit 1 on any disagreement). The HTML report
# (results/report/index.html there) shows the same comparison in its "Self-check" block.
SELFCHECK_DIR ?= selfcheck-run
selfcheck: setup
	$(BIN)/python -m posmech.verdicts.selfcheck build $(SELFCHECK_DIR)/resources/selfcheck
	$(BIN)/snakemake --cores $(CORES) --snakefile $(abspath workflow/Snakefile) --configfile $(abspath config/selfcheck.yaml) -d $(SELFCHECK_DIR) results/report/findings.csv results/report/index.html
	$(BIN)/python -m posmech selfcheck $(SELFCHECK_DIR)/results/report

study: setup
	$(BIN)/python -m posmech check-config config/config.yaml
	$(BIN)/snakemake --cores $(CORES)

# `make test` runs the suite, then the float32 tests (marker float32: a float32 forward pass
# checked within a float32 tolerance, tests/tolerances.py) a second time with other CPU kernels:
# ATen's scalar kernels instead of its AVX-512/AVX2 ones, MKL on one thread (another split of
# every matrix product) and at most AVX2.  A tolerance that holds for one kernel only then
# fails here, on one machine, rather than on a user's CPU (issue #49).  ~30 s on 2 cores.
FLOAT32_KERNELS ?= ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 MKL_ENABLE_INSTRUCTIONS=AVX2

test: setup
	$(BIN)/python -m pytest -q -ra --durations=30
	$(FLOAT32_KERNELS) $(BIN)/python -m pytest -q -ra -m float32

# A config key is written once, in workflow/schemas/config.schema.yaml (type, default,
# description); config/README.md's key tables and the settings classes' fields
# (src/posmech/settings/schema_fields.py) are written from it (src/posmech/settings/reference.py).
# Run after changing the schema; tests/test_config_reference.py and tests/test_settings.py fail
# until the files agree.
config-doc: setup
	$(BIN)/python -m posmech.settings.reference --write

# An analysis is declared once, in workflow/analyses/<rule>.yaml; the docs' tables of analyses
# (docs/workflow.md's families, analyses and applicability, docs/artifacts.md's files,
# docs/claims.md's "How each finding is judged") are written from the declarations
# (src/posmech/pipeline/reference.py), between `<!-- generated: NAME -->` and
# `<!-- end generated -->`. `make docs` rewrites them and what config-doc writes (an analysis's
# config keys and thresholds join the schema); tests/test_docs_generated.py fails until it has run.
docs: config-doc
	$(BIN)/python -m posmech.pipeline.reference --write
	$(BIN)/python -m posmech.pipeline.demo_numbers --write

# Every number of README.md and docs/*.md that `make demo` produces (head scores, held-out
# losses, the findings' counts, the twins' values, the P rules on demo) sits in a block
# `<!-- generated: numbers.NAME -->` written from docs/demo-numbers.json
# (src/posmech/pipeline/demo_numbers.py). After `make demo`, this stores that run's numbers
# there (from results/) and rewrites the blocks; tests/test_demo_numbers.py fails when a block
# differs from the file, when config/demo.yaml trains a model differently from the stored run,
# or when a run's number is typed by hand outside the blocks.
demo-numbers: setup
	$(BIN)/python -m posmech.pipeline.demo_numbers --from-run results config/demo.yaml

lint: setup
	$(BIN)/snakemake --lint --configfile config/demo.yaml
	$(BIN)/snakefmt --check workflow

format: setup
	$(BIN)/snakefmt workflow

# Delete exactly the outputs of the demo DAG (Snakemake knows them: prepared corpus,
# results/demo, the report, the model manifest), the trained model's files, the table
# sidecars left without their table, then the logs/ and benchmarks/ folders (of every run);
# .venv and the results of other configurations stay.
clean-demo:
	@if [ -x $(BIN)/snakemake ]; then \
	  $(BIN)/snakemake --cores 1 --configfile config/demo.yaml --delete-all-output; \
	fi
	@# table-metadata sidecars (NAME.meta.json) whose table is gone
	@if [ -d results ]; then find results -name '*.meta.json' -exec sh -c '[ -e "$${1%.meta.json}.csv" ] || rm "$$1"' _ {} \; ; fi
	rm -rf results/report logs benchmarks .snakemake/incomplete
	@# the Hugging Face folder of a model whose manifest was deleted (the trained demo model)
	@for d in resources/models/*/hf; do [ -d "$$d" ] && [ ! -e "$$(dirname $$d)/manifest.json" ] && rm -rf "$$d"; done; true
	@# the weights' hash cache beside a manifest that was deleted
	@for f in resources/models/*/weights.verified.json; do [ -e "$$f" ] && [ ! -e "$$(dirname $$f)/manifest.json" ] && rm -f "$$f"; done; true
	@# folders the deletions left empty
	@for d in results resources/models resources/corpora; do [ -d $$d ] && find $$d -mindepth 1 -type d -empty -delete; done; true
