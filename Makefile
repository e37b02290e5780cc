# SPDX-License-Identifier: MIT
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_BASE := $(VENV)/.installed-base
STAMP_ALL := $(VENV)/.installed-all

.PHONY: demo test soak lint typecheck unasync services bench chaos fuzz clean docs dist test-pythons

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP_BASE): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

$(STAMP_ALL): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[all,dev]'
	touch $@ $(STAMP_BASE)

demo: $(STAMP_BASE)
	$(BIN)/onceonly demo $(DEMO_ARGS)

services:
	scripts/services postgres redis rabbitmq rabbitmq-management nats mariadb pgbouncer kafka chromium

lint: $(STAMP_ALL)
	$(BIN)/ruff check src tests bench tools examples chaos
	$(BIN)/ruff format --check src tests bench tools examples chaos
	$(BIN)/python tools/unasync.py --check

typecheck: $(STAMP_ALL)
	$(BIN)/mypy

# pytest in PYTEST_WORKERS processes (pytest-xdist): most tests wait on servers, child
# processes, brokers' group joins or leases rather than on the CPU, so three workers on
# two cores keep both busy; worksteal hands the long tail's tests to idle workers.
# Every test owns its table / key prefix / vhost / port, so they share nothing.
# PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 3
test: $(STAMP_ALL) services lint typecheck docs
	CI=$${CI:-} $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

bench: $(STAMP_ALL) services
	$(BIN)/python bench/inbox_pg.py
	$(BIN)/python bench/leased_roundtrips.py
	$(BIN)/python bench/consumer_rabbitmq.py
	$(BIN)/python bench/consumer_nats.py
	$(BIN)/python bench/consumer_redis_streams.py
	$(BIN)/python bench/relay_pipeline.py

# The model checks, long: the multi-actor one runs at least ONCEONLY_SOAK_STEPS (10,000)
# steps per store, the single-actor one five times `make test`'s histories; and the
# Kafka poison runs that `make test` samples (both pre-count settings).
soak: $(STAMP_ALL) services
	ONCEONLY_SOAK=1 CI=$${CI:-} $(BIN)/python -m pytest -p no:randomly -q \
		tests/property/test_model_actors.py::test_interleaved_workers_agree_with_the_model \
		tests/property/test_model.py::test_store_agrees_with_the_model \
		tests/brokers/test_kafka_poison.py::test_only_the_worker_killing_record_is_dead_lettered \
		$(PYTEST_ARGS)

fuzz: $(STAMP_ALL) services
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -p no:randomly --timeout 3600 \
		tests/core/test_fuzz_core.py tests/contract/test_fuzz_inbox.py $(PYTEST_ARGS)

chaos: $(STAMP_ALL) services
	$(BIN)/python -m chaos $(CHAOS_ARGS)

# The documentation site (mkdocs.yml) into site/; --strict: a broken link, an unknown
# reference or a docstring warning fails it.
docs: $(STAMP_ALL)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The sdist and the wheel into dist/, checked as PyPI would (tests/packaging does it too).
dist: $(STAMP_ALL)
	rm -rf dist
	$(BIN)/python -m build --outdir dist
	$(BIN)/twine check --strict dist/*

# The suite minus brokers and long runs on the other supported Pythons (.venv-3.10,
# .venv-3.13; scripts/test-pythons says which tests and how it finds the interpreters).
PYTHONS ?= 3.10 3.13
test-pythons:
	scripts/services postgres
	CI=$${CI:-} scripts/test-pythons $(PYTHONS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site dist .venv-3.*
