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
	$(GO) test -count=1 ./rules/ ./consumer/

demo: services build
	set -a && . ./$(SERVICES_ENV) && set +a && ./$(BIN) demo

clean:
	rm -rf bin
