# cachewarden — see README.md.
GO ?= go
BIN := bin/cachewarden
SERVICES_ENV := .services/env

.PHONY: all build test unit services services-stop demo bench soak fuzz vet clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/cachewarden

# services starts memcached and makes sure a MariaDB answers (installing the
# Debian packages when they are missing), then writes .services/env.
services:
	scripts/services.sh start

services-stop:
	scripts/services.sh stop

vet:
	$(GO) vet ./...

# test starts the services, then runs every Go test (unit, fuzz seed
# corpora, real-service and end-to-end tests) and the example rule tests.
test: services build vet
	set -a && . ./$(SERVICES_ENV) && set +a && $(GO) test -count=1 -timeout 30m ./...
	./$(BIN) rules check configs/rules
	./$(BIN) rules test configs/rules/tests/*.yaml

# unit runs only the tests that need no service.
unit:
	$(GO) test -count=1 ./rules/ ./consumer/cdc/ ./ruletest/

# demo runs the whole pipeline once; DEMO_FLAGS are extra flags of
# `cachewarden demo`, e.g. make demo DEMO_FLAGS="--format debezium-avro"
# (Avro topics read through an in-process schema registry).
demo: services build
	set -a && . ./$(SERVICES_ENV) && set +a && ./$(BIN) demo $(DEMO_FLAGS)

# bench runs the end-to-end throughput benchmark (docs/benchmarks.md):
# a naive consumer, a competent one and `cachewarden run` over the same
# generated events, 300,000 per workload (the harness's own default is
# 1,000,000), 3 runs; the daemon on the counter workload against the
# binlog-enabled MariaDB that `make services` starts, fences on and off;
# the event-to-applied latency; then it rewrites the results section of
# docs/benchmarks.md. Extra cwbench flags go in BENCH_FLAGS, e.g.
# make bench BENCH_FLAGS="-events 1000000".
bench: services build
	$(GO) build -o bin/cwbench ./bench/cmd/cwbench
	$(GO) build -o bin/cwbroker ./bench/cmd/cwbroker
	set -a && . ./$(SERVICES_ENV) && set +a && ./bin/cwbench -events 300000 -doc docs/benchmarks.md $(BENCH_FLAGS)

# soak runs the fault suite (integration/fault*_test.go) at its long size:
# 200,000 events with 10 SIGKILLs of the daemon, 30 s memcached and MariaDB
# outages, killed daemons left to the broker's session timeout; then it
# rewrites the results section of docs/reliability.md. `make test` runs
# the same scenarios at CI size.
soak: services build
	set -a && . ./$(SERVICES_ENV) && set +a && CACHEWARDEN_SOAK=1 \
		CACHEWARDEN_RELIABILITY_REPORT=docs/reliability.md CACHEWARDEN_RELIABILITY_COMMAND="make soak" \
		$(GO) test -count=1 -timeout 3h -run '^TestFault' -v ./integration/

clean:
	rm -rf bin
