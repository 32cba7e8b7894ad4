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

.PHONY: help setup java-check demo test test-slow test-all lint typecheck bench bench-report mlflow-server clean jar horovod test-horovod \
        dist listener-jar test-compat

help:
	@echo "make demo    run conf/flights.yaml end to end (features, training, MLflow)"
	@echo "make test    run the default test suite (not 'slow')"
	@echo "make dist    build the wheel (with its listener jars) and the sdist into dist/"
	@echo "make test-compat   the wheel on pyspark 3.5, 4.0, 4.1 and 4.3 (venvs cached under work/compat)"
	@echo "make test-slow | bench | mlflow-server | jar | horovod | lint | typecheck | clean"

java-check:
	@command -v java >/dev/null 2>&1 || { echo "ERROR: java not found. sparktrain needs Java 17 (Spark 4.3). Install it, e.g. 'apt-get install openjdk-17-jre-headless', or set JAVA_HOME." >&2; exit 1; }
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	 if [ "$$v" != "17" ] && [ "$$v" != "21" ]; then echo "ERROR: Java $$v found, Spark 4.3 needs Java 17 (or 21). Install openjdk-17 and put it first on PATH or set JAVA_HOME." >&2; exit 1; fi

$(PY):
	@command -v $(PYTHON_BIN) >/dev/null 2>&1 || { echo "ERROR: $(PYTHON_BIN) not found; sparktrain needs Python 3.11 (set PYTHON_BIN=/path/to/python3.11)." >&2; exit 1; }
	$(PYTHON_BIN) -m venv $(VENV)

$(STAMP): $(PY) $(LOCK) python/requirements-data.lock python/pyproject.toml
	$(PY) -m pip install -q --upgrade "pip>=24" "setuptools>=77" wheel
	$(PY) -m pip install -q -r $(LOCK)
	$(PY) -m pip install -q --no-deps -r python/requirements-data.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e python
	touch $(STAMP)

setup: java-check $(STAMP) $(JAR)

# The JVM part (src/main/scala): compiled with the Scala compiler that ships inside pyspark's jars
# (Gradle cannot be installed here; build.gradle builds the same jar for users who use Gradle).
SCALA_SRC  := $(shell find src/main/scala -name '*.scala' 2>/dev/null)
SPARK_JARS  = $(shell $(PY) -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')

jar: java-check $(JAR)

# $(call listener_jar,SPARK_JARS_DIR,OUT): compile src/main/scala against the Spark in SPARK_JARS_DIR with the Scala
# compiler in those jars. The manifest records the Scala binary and Spark versions: sparktrain.jvm never loads a
# jar built for another Scala than the running Spark's (2.12 for Spark 3.5 on PyPI, 2.13 for Spark 4).
define listener_jar
	@set -e; jars="$(abspath $(1))"; out="$(abspath $(2))"; \
	scala=$$(ls "$$jars" | sed -n 's/^scala-library-\([0-9]*\.[0-9]*\)\..*\.jar$$/\1/p' | head -1); \
	spark=$$(ls "$$jars" | sed -n 's/^spark-core_[0-9.]*-\(.*\)\.jar$$/\1/p' | head -1); \
	test -n "$$scala" -a -n "$$spark" || { echo "ERROR: no scala-library/spark-core jar in $$jars" >&2; exit 1; }; \
	tmp=$$(mktemp -d); mkdir -p "$$tmp/META-INF" "$$(dirname "$$out")"; \
	java -cp "$$jars/*" scala.tools.nsc.Main -nowarn -d "$$tmp" -classpath "$$jars/*" $(abspath $(SCALA_SRC)); \
	printf 'Manifest-Version: 1.0\nImplementation-Title: sparktrain-listener\nImplementation-Version: %s\nScala-Binary-Version: %s\nSpark-Version: %s\n' \
	  "$(VERSION)" "$$scala" "$$spark" > "$$tmp/META-INF/MANIFEST.MF"; \
	(cd "$$tmp" && $(abspath $(PY)) -m zipfile -c "$$out.tmp" META-INF io); \
	mv "$$out.tmp" "$$out"; rm -rf "$$tmp"; echo "built $(2) (Scala $$scala, against Spark $$spark)"
endef
VERSION    := $(shell sed -n 's/^version = "\(.*\)"/\1/p' python/pyproject.toml)

$(JAR): $(STAMP) $(SCALA_SRC)
	$(call listener_jar,$(SPARK_JARS),$(JAR))

# One jar, for the compatibility matrix (tests/compat): make listener-jar LISTENER_SPARK_JARS=DIR LISTENER_OUT=JAR
listener-jar:
	$(call listener_jar,$(LISTENER_SPARK_JARS),$(LISTENER_OUT))

# The wheel carries one listener jar per Scala binary version: 2.13 (Spark 4.x) from the lock's pyspark, and
# 2.12 (Spark 3.5) compiled against pyspark $(SPARK_212)'s jars, fetched once into build/spark/ (pip, no deps).
SPARK_212  := 3.5.9
JAR_212    := build/jars/sparktrain-listener_2.12.jar
JAR_213    := build/jars/sparktrain-listener_2.13.jar
SPARK_212_JARS := build/spark/$(SPARK_212)/pyspark/jars

$(SPARK_212_JARS):
	rm -rf build/spark/$(SPARK_212)
	$(PY) -m pip install -q --no-deps --target build/spark/$(SPARK_212) pyspark==$(SPARK_212)

$(JAR_212): $(SCALA_SRC) | $(SPARK_212_JARS)
	$(call listener_jar,$(SPARK_212_JARS),$(JAR_212))

$(JAR_213): $(JAR)
	@mkdir -p build/jars && cp $(JAR) $(JAR_213)

# dist/: the wheel and the sdist, built (setuptools, no network) from a copy of python/ with the jars in
# sparktrain/jars/; the source tree stays as it is. Install: pip install 'dist/sparktrain-$(VERSION)-py3-none-any.whl[torch]'
dist: java-check $(STAMP) $(JAR_212) $(JAR_213)
	rm -rf build/dist-src dist && mkdir -p build/dist-src dist
	cp python/pyproject.toml build/dist-src/
	cp -r python/sparktrain build/dist-src/sparktrain
	find build/dist-src -name __pycache__ -prune -exec rm -rf {} + ; rm -rf build/dist-src/sparktrain/jars
	mkdir -p build/dist-src/sparktrain/jars && cp $(JAR_212) $(JAR_213) build/dist-src/sparktrain/jars/
	cp conf/spark-defaults.conf build/dist-src/sparktrain/spark-defaults.conf  # the wheel's Spark defaults
	cd build/dist-src && $(abspath $(PY)) -c 'from setuptools import build_meta as b; \
	  b.build_sdist("../../dist"); b.build_wheel("../../dist")' > ../dist.log 2>&1 || { cat ../dist.log; exit 1; }
	@ls -l dist/*; $(PY) -m zipfile -l dist/sparktrain-$(VERSION)-py3-none-any.whl | grep -E 'sparktrain/(jars/|spark-defaults)'

demo: setup
	$(VENV)/bin/sparktrain run conf/flights.yaml

# The 10 slowest tests are listed at the end of every run (--durations=10).
test: setup
	$(PY) -m pytest -c python/pyproject.toml --rootdir=. tests -m "not slow" --durations=10 $(PYTEST_ARGS)

# pytest exits 5 when no test is marked slow: that is not a failure. The compatibility matrix (marker compat,
# also slow) has its own target: make test-compat.
test-slow: setup
	$(PY) -m pytest -c python/pyproject.toml --rootdir=. tests -m "slow and not compat" $(PYTEST_ARGS) || [ $$? -eq 5 ]

test-all: setup
	$(PY) -m pytest -c python/pyproject.toml --rootdir=. tests -m "not compat" $(PYTEST_ARGS)

# The wheel from `make dist` in a venv per Spark line (work/compat/<pyspark>/, kept: a second run reuses them),
# each with that pyspark from PyPI and its own jar built with that pyspark's scalac, running the core scenario
# (tests/compat/scenario.py). COMPAT_VERSIONS="4.3.0" runs one line. About 4-6 min a line on 2 cores, plus the
# first download of each pyspark (~320 MB).
COMPAT_VERSIONS ?= 3.5.9 4.0.5 4.1.4 4.3.0
test-compat: dist
	COMPAT_VERSIONS="$(COMPAT_VERSIONS)" $(PY) -m pytest -c python/pyproject.toml --rootdir=. tests/compat \
	  -m compat -v $(PYTEST_ARGS)

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
	rm -rf work build dist .pytest_cache
