# sparktrain: `make demo` runs the main job end to end, `make test` runs the tests.
# Both set themselves up on a fresh machine: .venv on Python 3.11, pinned deps, the jar.

SHELL      := /bin/bash
PYTHON_BIN ?= python3.11
VENV       := .venv
PY         := $(VENV)/bin/python
STAMP      := $(VENV)/.sparktrain-installed
LOCK       := python/requirements.lock
JAR        := build/libs/sparktrain-listener.jar
export PYSPARK_PYTHON        := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export SPARK_LOCAL_IP        := 127.0.0.1
export PYTHONPATH            := $(abspath python)
PYTEST_ARGS ?=

.PHONY: help setup java-check demo test test-slow test-all lint typecheck bench bench-report mlflow-server clean jar horovod test-horovod

help:
	@echo "make demo    run conf/flights.yaml end to end (features, training, MLflow)"
	@echo "make test    run the default test suite (not 'slow')"
	@echo "make test-slow | bench | mlflow-server | jar | horovod | lint | typecheck | clean"

java-check:
	@command -v java >/dev/null 2>&1 || { echo "ERROR: java not found. sparktrain needs Java 17 (Spark 4.3). Install it, e.g. 'apt-get install openjdk-17-jre-headless', or set JAVA_HOME." >&2; exit 1; }
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	 if [ "$$v" != "17" ] && [ "$$v" != "21" ]; then echo "ERROR: Java $$v found, Spark 4.3 needs Java 17 (or 21). Install openjdk-17 and put it first on PATH or set JAVA_HOME." >&2; exit 1; fi

$(PY):
	@command -v $(PYTHON_BIN) >/dev/null 2>&1 || { echo "ERROR: $(PYTHON_BIN) not found; sparktrain needs Python 3.11 (set PYTHON_BIN=/path/to/python3.11)." >&2; exit 1; }
	$(PYTHON_BIN) -m venv $(VENV)

$(STAMP): $(PY) $(LOCK) python/pyproject.toml
	$(PY) -m pip install -q --upgrade "pip>=24" "setuptools>=77" wheel
	$(PY) -m pip install -q -r $(LOCK)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e python
	touch $(STAMP)

setup: java-check $(STAMP) $(JAR)

# The JVM part (src/main/scala): compiled with the Scala compiler that ships inside pyspark's jars
# (Gradle cannot be installed here; build.gradle builds the same jar for users who use Gradle).
SCALA_SRC  := $(shell find src/main/scala -name '*.scala' 2>/dev/null)
SPARK_JARS  = $(shell $(PY) -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')

jar: java-check $(JAR)

$(JAR): $(STAMP) $(SCALA_SRC)
	rm -rf build/classes && mkdir -p build/classes build/libs
	java -cp "$(SPARK_JARS)/*" scala.tools.nsc.Main -nowarn -d build/classes \
	     -classpath "$(SPARK_JARS)/*" $(SCALA_SRC)
	cd build/classes && $(abspath $(PY)) -m zipfile -c $(abspath $(JAR)).tmp io
	mv $(JAR).tmp $(JAR)

demo: setup
	$(VENV)/bin/sparktrain run conf/flights.yaml

test: setup
	$(PY) -m pytest -c python/pyproject.toml --rootdir=. tests -m "not slow" $(PYTEST_ARGS)

# pytest exits 5 when no test is marked slow: that is not a failure.
test-slow: setup
	$(PY) -m pytest -c python/pyproject.toml --rootdir=. tests -m "slow" $(PYTEST_ARGS) || [ $$? -eq 5 ]

test-all: setup
	$(PY) -m pytest -c python/pyproject.toml --rootdir=. tests $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check --config python/pyproject.toml python tests bench

typecheck: setup
	$(VENV)/bin/mypy --config-file python/pyproject.toml python/sparktrain

# MLflow UI + tracking server on 127.0.0.1 over the store `make demo` writes (MLFLOW_PORT=5001 to move it).
MLFLOW_PORT ?= 5000
mlflow-server: setup
	$(VENV)/bin/sparktrain mlflow-server --port $(MLFLOW_PORT) --backend-store-uri sqlite:///work/mlflow.db \
		--artifacts-destination work/mlartifacts

# Each benchmark prints our figure next to its baseline from the same run, as a ratio, and writes
# work/bench/<name>.json (every run, median, min-max); bench/report.py then regenerates the
# <!-- bench:NAME --> tables in README.md and docs/*.md.  Peers (petastorm, Ray) run in their own venvs
# under bench/peers/ (BENCH_PEERS=--no-petastorm ... to skip; bench/actors.py skips Ray without its venv,
# `bash bench/peers/setup-ray.sh` makes it).  Several minutes to an hour on 2 cores.
BENCH_REPEATS ?= 3
bench: setup
	$(PY) bench/reader.py --repeats 5
	$(PY) bench/preprocess.py
	$(PY) bench/train.py --flights --repeats $(BENCH_REPEATS)
	$(PY) bench/tune.py --repeats $(BENCH_REPEATS)
	$(PY) bench/actors.py --repeats $(BENCH_REPEATS)
	$(PY) bench/zoo.py
	$(PY) bench/faults.py
	$(PY) bench/keras_speed.py
	$(PY) bench/report.py

bench-report:
	$(PY) bench/report.py

# Horovod 0.28.1 (2023) is source-only and its C++14 flags clash with torch 2.13's C++17 headers:
# build it with a compiler wrapper that appends -std=c++17 (torch + gloo only, ~3 min on 2 cores).
HOROVOD_CXX := build/horovod/cxx17
horovod: setup
	@mkdir -p build/horovod
	@printf '#!/bin/sh\nexec g++ "$$@" -std=c++17\n' > $(HOROVOD_CXX) && chmod +x $(HOROVOD_CXX)
	@$(PY) -c "import horovod.torch" 2>/dev/null && echo "horovod already built" || \
	  CXX=$(abspath $(HOROVOD_CXX)) HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	  HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2 \
	  $(PY) -m pip install --no-build-isolation --no-cache-dir horovod==0.28.1

test-horovod: setup
	$(PY) -m pytest -c python/pyproject.toml --rootdir=. tests -m "horovod" $(PYTEST_ARGS)

clean:
	rm -rf work build .pytest_cache
