# disque-mp: `make run` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
VENV5 := .venv-redis5
# every compiled extension in the tree (the shard's, the front end's, the group library)
NATIVE_SO = $(shell find workers bus disque_mp -name '*.so')
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# the cores the mypyc build's gcc runs on at once (setup.py: MYPYC_JOBS, one C file each)
NPROC := $(shell nproc 2>/dev/null || echo 1)

.PHONY: run test lint typecheck unit bench chaos sysdeps clean pure compile wheel bench-brokers bench-frameworks extras

# The node's own virtualenv. Two stamps, so that `make run` installs only what a node
# needs (its dependencies, plus mypy and setuptools to compile it) and `make test` adds
# the rest (pytest, PySpark, Celery, Dramatiq ...); each re-installs when pyproject.toml
# changes.
$(VENV)/.base: pyproject.toml
	@echo "==> creating .venv: the node's dependencies, mypy and setuptools (pip, about 1 minute)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip 'setuptools>=77' 'mypy>=1.10'
	DISQUE_MP_PURE=1 $(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed: $(VENV)/.base
	@echo "==> installing the test tools, PySpark, Celery, Dramatiq, Taskiq into .venv (pip, a few minutes)"
	DISQUE_MP_PURE=1 $(PY) -m pip install -q -e '.[test,spark,celery,dramatiq,taskiq]'
	touch $@

# `make extras EXTRAS=celery,dramatiq`: extras (pyproject.toml: celery, dramatiq, taskiq,
# spark, bench, test) into .venv. DISQUE_MP_PURE=1 keeps pip from building the package
# (nothing is compiled again: the compiled modules in the tree stay) and -e keeps the
# editable install: `.venv/bin/pip install '.[celery]'` would compile everything again
# and replace it with a copy of the tree.
EXTRAS ?= celery,dramatiq,taskiq,spark
extras: $(VENV)/.base
	@echo "==> installing the extras [$(EXTRAS)] into .venv (pip; the compiled node is kept)"
	DISQUE_MP_PURE=1 $(PY) -m pip install -q -e '.[$(EXTRAS)]'

# One mypyc build (setup.py; the list is disque_mp/compiled.py) gives both the wheel that
# `pip install .` would build, kept in $(WHEEL_DIR) (tests/test_wheel.py installs it in a
# fresh venv and runs a node from it, outside the checkout), and the in-place modules:
# the wheel's extensions are unpacked into the tree, so the tree, the tests and `make run`
# use them. Rebuilt whenever a source of workers/, bus/ or disque_mp/ changes (no second
# list of the compiled modules to keep in step); `make pure` removes them.
WHEEL_DIR := $(VENV)/wheel
COMPILE_REPORT_S := 20
# measured: 132 s of CPU (mypyc's type check about 35 s of it, on one core), so about 2
# minutes on 2 idle cores; a busy machine takes longer (7.6 minutes at load 6-10)
COMPILE_TIME = about 2 minutes on 2 idle cores, less on more, longer on a busy machine
$(VENV)/.compiled: $(VENV)/.base setup.py $(wildcard workers/*.py bus/*.py disque_mp/*.py disque_mp/*/*.py disque_mp/*/*/*.py)
	@echo "==> compiling the node with mypyc: a type check, then gcc on $(NPROC) cores at once ($(COMPILE_TIME); a line every $(COMPILE_REPORT_S) s)"
	rm -rf $(WHEEL_DIR) build/lib*
	rm -f $(NATIVE_SO) *__mypyc*.so
	@touch $(VENV)/.compile-start; t=0; \
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w $(WHEEL_DIR) . >$(VENV)/compile.log 2>&1 & pid=$$!; \
	while kill -0 $$pid 2>/dev/null; do \
		sleep 1; t=$$((t + 1)); [ $$((t % $(COMPILE_REPORT_S))) = 0 ] || continue; \
		o=$$(find build -name '*.o' -newer $(VENV)/.compile-start 2>/dev/null | wc -l); \
		if [ $$o = 0 ]; then echo "    $$t s: type check and C generation"; \
		else echo "    $$t s: gcc, $$o of $$(find build -name '*.c' | wc -l) C files compiled"; fi; \
	done; \
	wait $$pid || { tail -n 40 $(VENV)/compile.log; echo "compile failed; the whole log: $(VENV)/compile.log"; exit 1; }; \
	echo "    compiled in $$t s"
	$(PY) -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); z.extractall(".", [n for n in z.namelist() if n.endswith(".so")])' $(WHEEL_DIR)/disque_mp-*.whl
	$(PY) -m disque_mp.compiled stamp
	rm -rf build/lib* build/bdist*  # copies of the sources: keep only the C build cache
	touch $@

# pydisque is also tested on redis-py 5, which cannot share a venv with redis-py 8.
$(VENV5)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV5)
	$(VENV5)/bin/python -m pip install -q 'redis>=5,<6' 'pydisque==0.1.5'
	touch $@

# System packages the tests use: redis-server/redis-cli/redis-benchmark (reference
# side of the benchmarks, redis-cli transcripts), a Java 17 runtime for PySpark, and
# Debian's chromium + chromium-driver for the dashboard's browser tests (tests/browser/).
sysdeps:
	@if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null || ! command -v redis-benchmark >/dev/null; then \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null; \
		$(SUDO) systemctl disable --now redis-server >/dev/null 2>&1 || true; \
		$(SUDO) service redis-server stop >/dev/null 2>&1 || true; \
	fi
	@# rabbitmq-server: the RabbitMQ side of make bench-brokers (each run starts its own
	@# node on free ports); the service the package starts is stopped and disabled
	@if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null; \
		$(SUDO) systemctl disable --now rabbitmq-server >/dev/null 2>&1 || true; \
		$(SUDO) service rabbitmq-server stop >/dev/null 2>&1 || true; \
		epmd -kill >/dev/null 2>&1 || true; \
	fi
	@# beanstalkd: tests/bench/test_peers.py drives a real one (started on a free port)
	@if ! command -v beanstalkd >/dev/null; then \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq beanstalkd >/dev/null; \
		$(SUDO) systemctl disable --now beanstalkd >/dev/null 2>&1 || true; \
		$(SUDO) service beanstalkd stop >/dev/null 2>&1 || true; \
	fi
	@if ! command -v openssl >/dev/null; then \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null; \
	fi
	@# valgrind: bench/instructions.py counts a whole node's instructions under callgrind
	@if ! command -v valgrind >/dev/null || ! command -v callgrind_control >/dev/null; then \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null; \
	fi
	@if ! command -v java >/dev/null || ! java -version 2>&1 | grep -qE 'version "(17|21)'; then \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; \
	fi
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	fi

compile: $(VENV)/.compiled

wheel: $(VENV)/.compiled
	@ls $(WHEEL_DIR)/*.whl

pure:
	rm -rf $(VENV)/.compiled $(WHEEL_DIR) $(NATIVE_SO) *__mypyc*.so disque_mp/.native-stamp.json

# `make run PORT=7712` (bus on PORT + 10000, dashboard on PORT + 69: 7780 for 7711;
# HTTP_PORT=... another, HTTP_PORT=0 none); the node's files (nodes.conf, log, AOF) stay
# in run/ (run/PORT/ for another port). Its jobs survive a restart: appendonly yes,
# fsync everysec (APPENDONLY=no for a node that forgets them, the binary's default).
PORT ?= 7711
HTTP_PORT ?= $(shell expr $(PORT) + 69)
RUN_DIR ?= $(if $(filter 7711,$(PORT)),run,run/$(PORT))
APPENDONLY ?= yes

run: $(VENV)/.compiled
	@mkdir -m 700 -p $(RUN_DIR)
	@echo "==> starting the node on 127.0.0.1:$(PORT), files in $(RUN_DIR)/ (Ctrl-C stops it)"
	@[ "$(HTTP_PORT)" = 0 ] || echo "Dashboard: http://127.0.0.1:$(HTTP_PORT)/  (metrics: http://127.0.0.1:$(HTTP_PORT)/metrics)"
	$(VENV)/bin/disque-mp --bind 127.0.0.1 --port $(PORT) --dir $(RUN_DIR) --http-port $(HTTP_PORT) --http-bind 127.0.0.1 --appendonly $(APPENDONLY) --appendfsync everysec

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

# The tests that start no node process (no `integration` marker): the shard, parsers,
# the simulation, the client's core; a few minutes.
unit: $(VENV)/.installed $(VENV)/.compiled
	$(PY) -m pytest -q -m "not integration" tests/workers tests/bus tests/node tests/client tests/sim

# The compiled suite in TEST_PROCS processes (pytest-xdist; one file, or tests/spark
# whole, per process at a time: tests/conftest.py), then the tests marked `serial`
# alone, then the uncompiled source (DISQUE_MP_PURE=1) where the compiled modules
# (disque_mp/compiled.py) are exercised in process: the shard, the simulation, the
# front end's parsers, commands and GETJOB paths, the cluster bus (PURE_TESTS, the
# tests without the integration marker), plus the front end's end-to-end tests. The
# rest (client, config, benchmarks) imports no compiled module, so a second run proves
# nothing the first did not. docs/testing.md has the times.
TEST_PROCS ?= 4
PURE_TESTS := tests/workers tests/sim tests/bus tests/node/test_aof_manager.py \
	tests/node/test_cmd_jobs.py tests/node/test_core.py tests/node/test_getjob_merge.py \
	tests/node/test_memory.py tests/node/test_resp.py tests/node/test_security_resp.py \
	tests/node/test_security_names_guesses.py
# The build and lint run side by side (-j3): mypyc's type check is one core for a
# minute or more before its gcc runs use them all, and lint, the redis-py 5 venv and the
# build touch no common file (mypyc's type check keeps no cache: it runs with
# incremental off).
test: sysdeps $(VENV)/.installed
	$(MAKE) --no-print-directory -j3 $(VENV)/.compiled $(VENV5)/.installed lint
	$(PY) -m pytest -q -n $(TEST_PROCS) --dist loadfile --no-loadscope-reorder -m "not serial"
	$(PY) -m pytest -q -p no:cacheprovider -m serial
	DISQUE_MP_PURE=1 $(PY) -m pytest -q -p no:cacheprovider -m "not integration" $(PURE_TESTS)
	DISQUE_MP_PURE=1 $(PY) -m pytest -q -p no:cacheprovider tests/node/test_frontend.py

bench: sysdeps $(VENV)/.installed $(VENV)/.compiled
	$(PY) -m bench.run_all

# disque-mp head to head with RabbitMQ (classic and quorum queues), NATS JetStream, Redis
# (lists and Streams), beanstalkd and the C reference Disque: every peer a real server on
# free loopback ports, started and stopped by bench/peers.py; writes bench/results/peers.md,
# peers.json and two plots (7 minutes at load 5-10 on 2 cores). The Debian packages start
# their services on install: stopped and disabled here, and the epmd that RabbitMQ's service
# started is killed (the benchmark runs its own on a private port).
PEERS_DEBS := rabbitmq-server nats-server beanstalkd gcc make
$(VENV)/.bench-installed: pyproject.toml $(VENV)/.installed
	DISQUE_MP_PURE=1 $(PY) -m pip install -q -e '.[bench]'
	touch $@

.PHONY: bench-peers
bench-peers: sysdeps $(VENV)/.compiled $(VENV)/.bench-installed
	@if ! command -v nats-server >/dev/null || ! command -v beanstalkd >/dev/null || ! command -v gcc >/dev/null \
			|| [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(PEERS_DEBS) >/dev/null; \
		for s in rabbitmq-server nats-server beanstalkd; do \
			$(SUDO) systemctl disable --now $$s >/dev/null 2>&1 || true; \
			$(SUDO) service $$s stop >/dev/null 2>&1 || true; \
		done; \
		$(SUDO) epmd -kill >/dev/null 2>&1 || true; \
	fi
	$(PY) -m bench.peers

# The proof against the brokers Python teams run: the same Celery and Dramatiq apps with
# real workers on disque-mp, redis-server and rabbitmq-server (about 30 minutes);
# bench/results/brokers-proof.{json,md}. The assertions on disque-mp are in make test.
bench-brokers: sysdeps $(VENV)/.installed $(VENV)/.compiled
	$(PY) -m bench.brokers_proof

# The same Celery and Dramatiq apps end to end on disque://, redis:// and amqp:// (a
# rabbitmq-server of its own on free ports): no-op tasks/s, consume alone, paced p99;
# bench/results/brokers.{json,md}.
bench-frameworks: sysdeps $(VENV)/.installed $(VENV)/.compiled
	$(PY) -m bench.brokers --tasks 5000 --paced-tasks 1000 --rounds 3

# The horizontal-scaling record: 1, 2 and 4 nodes, REPLICATE 1/2/3, local and federated
# traffic, node CPU per job beside the C reference (bench/results/hosts.md; about 4
# minutes). Before/after: `$(PY) -m bench.hosts --trees base=DIR new=.`.
.PHONY: bench-hosts
bench-hosts: sysdeps $(VENV)/.installed $(VENV)/.compiled
	$(PY) -m bench.hosts

# The long fault suite: 5 nodes in network namespaces (needs root and iproute2), every
# fault kind, about 10 minutes per seed, three seeds in a row; history JSON, PNG
# timelines and summary.md in bench/results/chaos/ (tests/faults/chaos.py).
CHAOS_SEEDS ?= 1 2 3
chaos: $(VENV)/.installed $(VENV)/.compiled
	$(PY) -m tests.faults.chaos --seeds $(CHAOS_SEEDS) --out bench/results/chaos

clean:
	rm -rf $(VENV) $(VENV5) build *.egg-info $(NATIVE_SO) *__mypyc*.so disque_mp/.native-stamp.json .pytest_cache .mypy_cache .ruff_cache
