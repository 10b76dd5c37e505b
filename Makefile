# Two commands a newcomer needs: `make demo` and `make test`. Both set everything up.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup demo test unit functional lint proto clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,spark]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup  ## the main job on the embedded broker
	$(BIN)/kmq demo

test: setup lint  ## every test: unit and functional (embedded broker unless KMQ_TEST_BOOTSTRAP_SERVERS)
	$(BIN)/pytest -q

unit: setup
	$(BIN)/pytest -q tests/unit

functional: setup
	$(BIN)/pytest -q tests/functional

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

proto: setup  ## regenerate kmq/_proto from proto/marker.proto
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=kmq/_proto --pyi_out=kmq/_proto proto/marker.proto

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

.PHONY: bench bench-quick

bench: setup  ## the full benchmark (~15 min): bench/results/full.{json,md}
	$(BIN)/python -m bench

bench-quick: setup  ## the benchmark in under 2 minutes: bench/results/quick.{json,md}
	$(BIN)/python -m bench --quick

.PHONY: chaos spark-cluster

spark-cluster: setup  ## the audit and the streaming source on local-cluster[2,1,1024] vs local[2] (2-7 min)
	$(BIN)/pytest -q tests/functional/spark_cluster_check.py

chaos: setup  ## the full chaos run, 100,000 messages (about 35 minutes on 2 cores); `make test` runs a reduced one
	KMQ_CHAOS_MESSAGES=$${KMQ_CHAOS_MESSAGES:-100000} KMQ_CHAOS_SECONDS=$${KMQ_CHAOS_SECONDS:-1800} \
	KMQ_CHAOS_SESSION_TIMEOUT_MS=$${KMQ_CHAOS_SESSION_TIMEOUT_MS:-6000} \
	KMQ_CHAOS_TRACKER_SESSION_TIMEOUT_MS=$${KMQ_CHAOS_TRACKER_SESSION_TIMEOUT_MS:-3000} \
	KMQ_CHAOS_WORKER_KILL_EVERY_S=$${KMQ_CHAOS_WORKER_KILL_EVERY_S:-20} \
	KMQ_CHAOS_TRACKER_KILL_EVERY_S=$${KMQ_CHAOS_TRACKER_KILL_EVERY_S:-60} \
	KMQ_CHAOS_MAX_IN_FLIGHT=$${KMQ_CHAOS_MAX_IN_FLIGHT:-40} KMQ_CHAOS_HANDLERS=$${KMQ_CHAOS_HANDLERS:-4} \
		$(BIN)/pytest -q -s tests/chaos
