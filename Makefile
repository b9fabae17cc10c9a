# packer: the README's commands. `make demo` and `make test` work on a fresh machine.
# `make demo` installs packer's light core (no torch) into .venv-demo; `make setup`, `make test`
# and the other targets install the development stack (torch's CPU wheel, transformers, Ray...)
# into .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_VENV := .venv-demo
# torch 2.13.0, CPU build: the test suite and the docs' examples run on a CPU. Where pip's own
# indexes would give torch's CUDA build (PyPI on Linux does), name PyTorch's CPU index:
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_PIN := torch==2.13.0
TORCH_INDEX ?=
STAMP := $(VENV)/.installed
DEMO_STAMP := $(DEMO_VENV)/.installed
REAL_TOKENIZER := .whl/anthropic-0.38.0-py3-none-any.whl
LLAMA_CPP_SDIST := .whl/llama_cpp_python-0.3.36.tar.gz
LLAMA_MODELS_WHEEL := .whl/llama_models-0.3.0-py3-none-any.whl
REAL_TEMPLATES := vendor/llama.cpp/models/.extracted
LLAMA3_TOKENIZER := vendor/llama-models/llama3/tokenizer.model

# Bytecode: pip would compile all 19,000 modules it installs (a minute of one core); instead each
# module is compiled on its first import and kept, also where the caller's environment sets
# PYTHONDONTWRITEBYTECODE (this machine's image does): the suite imports about 2,500 of them,
# and each `packer` subprocess it starts loads packer's bytecode instead of compiling its sources.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup demo test check lint format bench sample train-tiny mutation readers clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-compile $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_PIN)"
	$(BIN)/pip uninstall -q -y packer 2>/dev/null || true  # the distribution's name before packer-llm
	$(BIN)/pip install -q --no-compile -e ".[dev]" "$(TORCH_PIN)"
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/pip install -q --upgrade pip
	$(DEMO_VENV)/bin/pip install -q .   # the core: no torch
	touch $(DEMO_STAMP)

setup: $(STAMP) $(REAL_TOKENIZER) $(REAL_TEMPLATES) $(LLAMA3_TOKENIZER)
	$(BIN)/packer warmup

# a real tokenizer for tests/test_real_tokenizer.py: the anthropic 0.38.0 wheel on PyPI ships a
# 65,000-token BPE as anthropic/tokenizer.json; the wheel is downloaded (not installed) once
$(REAL_TOKENIZER): $(STAMP)
	$(BIN)/pip download -q --no-deps --dest .whl anthropic==0.38.0

# real chat templates and vocabularies for tests/test_template_families.py and
# tests/test_real_vocabularies.py (tests/real_templates.py): llama.cpp's ~70 templates and its
# vocab-only GGUF files with their expected ids, out of the llama-cpp-python 0.3.36 sdist, and
# Meta's Llama 3 tokenizer.model, out of the llama-models 0.3.0 wheel; both downloaded (not
# installed, not built) once, only those files extracted into vendor/ (gitignored)
$(LLAMA_CPP_SDIST): | $(STAMP)
	$(BIN)/pip download -q --no-deps --no-binary :all: --dest .whl llama-cpp-python==0.3.36

$(LLAMA_MODELS_WHEEL): | $(STAMP)
	$(BIN)/pip download -q --no-deps --dest .whl llama-models==0.3.0

$(REAL_TEMPLATES): $(LLAMA_CPP_SDIST)
	tar xzf $(LLAMA_CPP_SDIST) --strip-components=1 --wildcards \
		'llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/*.jinja' \
		'llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-*'
	touch $(REAL_TEMPLATES)

$(LLAMA3_TOKENIZER): $(LLAMA_MODELS_WHEEL)
	mkdir -p $(dir $(LLAMA3_TOKENIZER))
	$(BIN)/python -c "import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))" \
		$(LLAMA_MODELS_WHEEL) llama_models/llama3/tokenizer.model > $(LLAMA3_TOKENIZER).tmp
	mv $(LLAMA3_TOKENIZER).tmp $(LLAMA3_TOKENIZER)

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/packer pack data/sample.jsonl.gz --config configs/ctx4k.yaml --output out/demo --overwrite

test: setup
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q

# `make check`, before each commit: the tests a change most likely breaks, aimed at under 3
# minutes on 2 cores (1,023 tests, 51 s on 2 idle cores). Packing (files, columns, repack, blocks, out of core, mixtures, CP, accounting),
# planning, reading, the output contract, verify's structure checks and kernels, tokenize's
# encoder and hub loading, the CLI's edges, errors and messages, the import layers, --help
# against docs/cli.md, and the CLI on the core install (.venv-core). The Ray, resume, signal,
# storage-server, export-reader and docs-page tests (and those marked `slow`, `ray` or
# `storage`) run in `make test` only, the whole suite that CI runs.
CHECK_MODULES := pack pack_dataset column_options repack blocks out_of_core accounting shards \
	contract output_version stats incomplete guards direct reader_fuzz tokenize_run_files \
	plan_cli algorithms balance mixture mix_plan mix_cli cp_pack cp_verify cp_zigzag gather \
	verify_cli verify_kernels verify_faults verify_rejects verify_messages verify_report \
	verify_library pairs_verify export_kernels inspect tokenize_encode hub_wait run_records \
	cli_edges errors messages layers help docs doc_snippets version core_install tokenize_spans \
	raw_record_trust tokenizer_reuse worker_flag_names
CHECK_TESTS := $(foreach m,$(CHECK_MODULES),tests/test_$(m).py)

check: setup
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q -m "not slow and not ray and not storage" \
		$(CHECK_TESTS)

lint: setup
	$(BIN)/ruff check packer tests scripts
	$(BIN)/ruff format --check packer tests scripts

format: setup
	$(BIN)/ruff format packer tests scripts
	$(BIN)/ruff check --fix packer tests scripts

bench: setup
	$(BIN)/pip install -q -e ".[bench,ray]" "$(TORCH_PIN)"
	$(BIN)/python scripts/bench_plan.py
	$(BIN)/python scripts/bench_pack.py --runs 5 --trl-runs 3
	$(BIN)/python scripts/bench_memory.py --sizes 250000 1000000
	$(BIN)/python scripts/bench_memory.py --format jsonl --sizes 50000 200000
	$(BIN)/python scripts/bench_startup.py --runs 5
	$(BIN)/python scripts/bench_raw_startup.py --runs 5
	$(BIN)/python scripts/bench_api.py --runs 3
	$(BIN)/python scripts/bench_balance.py
	$(BIN)/python scripts/bench_cp.py --repeats 5
	$(BIN)/python scripts/bench_ray.py --runs 3
	$(BIN)/python scripts/bench_pairs.py --pairs 10000 -L 4096 --batch 4 8 16

# the trainers' own readers that prove `packer export` (docs/export.md), in a virtualenv of their own
readers: setup
	$(BIN)/python scripts/readers_venv.py

# axolotl 0.19.0 (torch's CPU build) in a virtualenv of its own, for
# scripts/bench_tokenize.py --axolotl; does nothing once built
axolotl-venv:
	scripts/axolotl_venv.sh

train-tiny: setup
	$(BIN)/python scripts/train_tiny.py

# mutation testing of packer/verify/ and packer/torch/collate.py with mutmut (config in setup.cfg;
# not in CI: 25-50 minutes on 2 cores). Score, command and survivors: docs/mutation.md
mutation: setup
	$(BIN)/pip install -q -e ".[mutation]" "$(TORCH_PIN)"
	rm -rf mutants
	OMP_NUM_THREADS=1 $(BIN)/mutmut run --max-children 2
	$(BIN)/mutmut results

# the GPU proof of `packer verify` (docs/verify.md#the-gpu-proof): every kernel, pack + verify,
# a planted fault, --model, a 32k row, then the CPU suite with CUDA hidden; report in
# out/gpu-check/. Needs torch with CUDA (flash-attn, flash-attn 3 where installed); fetches
# nothing. Without a GPU it runs what needs none and exits 3. GPU_CHECK_ARGS=--no-suite etc.
.PHONY: gpu-check
gpu-check: $(STAMP)
	$(BIN)/python scripts/gpu_check.py $(GPU_CHECK_ARGS)

sample: setup
	$(BIN)/python scripts/make_sample.py data/sample.jsonl.gz

clean:
	rm -rf out .pytest_cache .ruff_cache
