# disque-mp: `make run` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
VENV5 := .venv-redis5
# every compiled extension in the tree (the shard's, the front end's, the group library)
NATIVE_SO = $(shell find workers disque_mp -name '*.so')
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test lint typecheck unit bench chaos sysdeps clean pure compile bench-brokers bench-frameworks

# The node's own virtualenv; re-installed when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip 'setuptools>=77'
	DISQUE_MP_PURE=1 $(PY) -m pip install -q -e '.[test,spark,celery,dramatiq]'
	touch $@

# The modules of disque_mp/compiled.py compiled with mypyc, in place (setup.py):
# rebuilt whenever a source of workers/ or disque_mp/ changes (no second list of the
# compiled modules to keep in step); `make pure` removes them.
$(VENV)/.compiled: $(VENV)/.installed setup.py $(wildcard workers/*.py disque_mp/*.py disque_mp/*/*.py disque_mp/*/*/*.py)
	rm -f *__mypyc*.so disque_mp/*__mypyc*.so
	$(PY) setup.py -q build_ext --inplace >/dev/null
	$(PY) -m disque_mp.compiled stamp
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

pure:
	rm -f $(VENV)/.compiled $(NATIVE_SO) *__mypyc*.so disque_mp/.native-stamp.json

HTTP_PORT ?= 7780

run: $(VENV)/.compiled
	mkdir -p run
	@echo "Dashboard: http://127.0.0.1:$(HTTP_PORT)/  (metrics: http://127.0.0.1:$(HTTP_PORT)/metrics)"
	$(VENV)/bin/disque-mp --bind 127.0.0.1 --port 7711 --dir run --http-port $(HTTP_PORT) --http-bind 127.0.0.1

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: sysdeps $(VENV)/.compiled $(VENV5)/.installed lint
	$(PY) -m pytest -q
	# the same source uncompiled (DISQUE_MP_PURE=1): shard, simulation, front end (the
	# tests without the integration marker, plus the front end's end-to-end tests)
	DISQUE_MP_PURE=1 $(PY) -m pytest -q -p no:cacheprovider -m "not integration" \
		tests/workers tests/bus tests/node tests/client tests/bench tests/sim
	DISQUE_MP_PURE=1 $(PY) -m pytest -q -p no:cacheprovider tests/node/test_frontend.py

bench: sysdeps $(VENV)/.compiled
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
bench-brokers: sysdeps $(VENV)/.compiled
	$(PY) -m bench.brokers_proof

# The same Celery and Dramatiq apps end to end on disque://, redis:// and amqp:// (a
# rabbitmq-server of its own on free ports): no-op tasks/s, consume alone, paced p99;
# bench/results/brokers.{json,md}.
bench-frameworks: sysdeps $(VENV)/.compiled
	$(PY) -m bench.brokers --tasks 5000 --paced-tasks 1000 --rounds 3

# The long fault suite: 5 nodes in network namespaces (needs root and iproute2), every
# fault kind, about 10 minutes per seed, three seeds in a row; history JSON, PNG
# timelines and summary.md in bench/results/chaos/ (tests/faults/chaos.py).
CHAOS_SEEDS ?= 1 2 3
chaos: $(VENV)/.compiled
	$(PY) -m tests.faults.chaos --seeds $(CHAOS_SEEDS) --out bench/results/chaos

clean:
	rm -rf $(VENV) $(VENV5) build *.egg-info $(NATIVE_SO) *__mypyc*.so disque_mp/.native-stamp.json .pytest_cache .mypy_cache .ruff_cache
