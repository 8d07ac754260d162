# cachewarden — see README.md.
GO ?= go
BIN := bin/cachewarden
SERVICES_ENV := .services/env
# VERSION is stamped into the binary (`cachewarden version`, --version,
# the start-up log, cachewarden_build_info, /version): git's description of
# the checkout unless given, e.g. make build VERSION=v1.4.0.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
LDFLAGS_VERSION := -X main.buildVersion=$(VERSION)

.PHONY: all build test unit services services-demo services-bench services-stop services-status demo bench soak fuzz vet static image clean

all: build

build:
	$(GO) build -ldflags="$(LDFLAGS_VERSION)" -o $(BIN) ./cmd/cachewarden

# services starts what `make test` needs (scripts/services.sh start:
# memcached, a MariaDB, two private MariaDBs with the binary log on, the
# other languages' memcached clients, promtool), installing Debian packages
# only when something is missing, then writes .services/env.
# services-demo starts only what `make demo` needs (memcached and a
# MariaDB), services-bench what `make bench` needs (and a MariaDB with the
# binary log on). services-stop stops what the script started;
# services-status says what is running.
services:
	scripts/services.sh start

services-demo:
	scripts/services.sh demo

services-bench:
	scripts/services.sh bench

services-stop:
	scripts/services.sh stop

services-status:
	scripts/services.sh status

vet:
	$(GO) vet ./...

# test starts the services, then runs every Go test (unit, fuzz seed
# corpora, real-service and end-to-end tests, the alert rules' promtool
# tests, the dashboard's metrics) and the example rule tests, then says
# which services stay running.
test: services build vet
	set -a && . ./$(SERVICES_ENV) && set +a && $(GO) test -count=1 -timeout 30m ./... && \
		./$(BIN) rules check configs/rules && \
		./$(BIN) rules test configs/rules/tests/*.yaml; \
		status=$$?; scripts/services.sh status; exit $$status

# unit runs only the tests that need no service.
unit:
	$(GO) test -count=1 ./rules/ ./decode/ ./ruletest/

# demo runs the whole pipeline once with the demo's own command,
# cmd/cachewarden-demo (the production binary does not link its harness);
# DEMO_FLAGS are its flags, e.g. make demo DEMO_FLAGS="--format debezium-avro"
# (Avro topics read through an in-process schema registry), or
# make demo DEMO_FLAGS="--source binlog" (the daemon reads the binary log of
# a MariaDB, no broker: the services then include one with the binary log
# on, scripts/services.sh demo-binlog).
DEMO_BIN := bin/cachewarden-demo
DEMO_SERVICES := $(if $(findstring binlog,$(DEMO_FLAGS)),demo-binlog,demo)
demo:
	scripts/services.sh $(DEMO_SERVICES)
	$(GO) build -o $(DEMO_BIN) ./cmd/cachewarden-demo
	set -a && . ./$(SERVICES_ENV) && set +a && ./$(DEMO_BIN) $(DEMO_FLAGS); \
		status=$$?; scripts/services.sh status; exit $$status

# bench runs the end-to-end throughput benchmark (docs/benchmarks.md):
# a naive consumer, a competent one and `cachewarden run` over the same
# generated events, 300,000 per workload (the harness's own default is
# 1,000,000), 3 runs; the daemon on the counter workload against the
# binlog-enabled MariaDB that `make services-bench` starts, fences on and off;
# the event-to-applied latency; then it rewrites the results section of
# docs/benchmarks.md. Extra cwbench flags go in BENCH_FLAGS, e.g.
# make bench BENCH_FLAGS="-events 1000000". Then readers on the GTID
# replica that services-bench starts, plain, rebump_after and fenced, at
# each replica lag (BenchmarkReplicaReaders; it prints its tables, which
# docs/benchmarks.md, "Readers on replicas", quotes; its flags go in
# REPLICA_BENCH_FLAGS). Last, the daemon on the binary log source
# (BenchmarkBinlogSource, running bin/cachewarden): commit to namespace
# moved, and its CPU per row event against the Kafka path's; it prints its
# tables, which docs/benchmarks.md, "The binary log source", quotes; its
# flags go in BINLOG_BENCH_FLAGS.
bench: services-bench build
	$(GO) build -o bin/cwbench ./bench/cmd/cwbench
	$(GO) build -o bin/cwbroker ./bench/cmd/cwbroker
	set -a && . ./$(SERVICES_ENV) && set +a && ./bin/cwbench -events 300000 -doc docs/benchmarks.md $(BENCH_FLAGS)
	set -a && . ./$(SERVICES_ENV) && set +a && $(GO) test ./bench -run '^$$' -bench ReplicaReaders -benchtime 1x $(REPLICA_BENCH_FLAGS)
	set -a && . ./$(SERVICES_ENV) && set +a && $(GO) test ./bench -run '^$$' -bench BinlogSource -benchtime 1x -binlog.daemon $(CURDIR)/$(BIN) $(BINLOG_BENCH_FLAGS)

# soak runs the fault suite (integration/fault*_test.go) at its long size:
# 200,000 events with 10 SIGKILLs of the daemon, 30 s memcached and MariaDB
# outages, killed daemons left to the broker's session timeout; then it
# rewrites the results section of docs/reliability.md. `make test` runs
# the same scenarios at CI size.
soak: services build
	set -a && . ./$(SERVICES_ENV) && set +a && CACHEWARDEN_SOAK=1 \
		CACHEWARDEN_RELIABILITY_REPORT=docs/reliability.md CACHEWARDEN_RELIABILITY_COMMAND="make soak" \
		$(GO) test -count=1 -timeout 3h -run '^TestFault' -v ./integration/

# static builds the binary as the container image does: no cgo, so it
# needs no C library and runs on a distroless or scratch base.
static:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w $(LDFLAGS_VERSION)" -o bin/cachewarden-static ./cmd/cachewarden

# image builds the container image (deploy/container/Dockerfile) where a
# Docker engine answers; elsewhere it says how else to build it.
IMAGE ?= cachewarden:latest
image:
	@if docker info >/dev/null 2>&1; then \
		docker build -f deploy/container/Dockerfile --build-arg VERSION=$(VERSION) -t $(IMAGE) . ; \
	else \
		echo "make image: no Docker engine answers here. Build deploy/container/Dockerfile elsewhere" >&2; \
		echo "  (docker build -f deploy/container/Dockerfile --build-arg VERSION=$(VERSION) -t $(IMAGE) . ; or podman/buildah the same way)," >&2; \
		echo "  or run the static binary of 'make static' directly (deploy/systemd)." >&2; \
		exit 1; \
	fi

clean:
	rm -rf bin
