# aggd — build, test and lab targets. Run `make help` for the list.
SHELL := /bin/bash
# Go: the first of PATH's go and /usr/local/go/bin/go (where scripts/deps.sh installs it
# when no Go is as new as go.mod asks) that is new enough. Its directory leads PATH, so
# that the scripts and tests make runs use the same one.
ifeq ($(origin GO),undefined)
GO := $(or $(shell python3 scripts/install-go.py --find 2>/dev/null),go)
endif
GO_DIR := $(if $(findstring /,$(GO)),$(patsubst %/,%,$(dir $(GO))))
export PATH := $(if $(GO_DIR),$(GO_DIR):)$(PATH)
BIN   := bin/aggd
PKGS  := ./...
VERSION := $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/aggd/aggd/internal/buildinfo.Version=$(VERSION)

GOBIN := $(shell $(GO) env GOPATH 2>/dev/null)/bin

.PHONY: help deps generate build test test-unit test-alerts test-bpf-lts test-package deb fuzz bench demo lab lint clean

help: ## show this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

deps: ## install build/test/lab dependencies, Go included if missing (Debian/Ubuntu, idempotent; needs root)
	./scripts/deps.sh

generate: ## compile the BPF programs (bpf2go, little and big endian)
	$(GO) generate ./internal/bpf/...

build: generate ## build bin/aggd
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/aggd

test: build ## run all tests (unit, BPF in-kernel, fuzzing FUZZTIME per target, end-to-end in netns, the daemon's packages under -race; needs root)
	python3 scripts/install_go_test.py
	python3 test/vm/figures_test.py
	$(MAKE) --no-print-directory test-alerts
	./scripts/fuzz-all.sh $${FUZZTIME:-50000x}
	@# -p 1: one package at a time. The end-to-end tests measure links through daemons
	@# that need the CPU; the SPIN model check running beside them on a 2-core machine
	@# starved them into CPU-bound, meaningless splits.
	$(GO) test -p 1 -count=1 -timeout 40m $(PKGS)
	@echo "test: the end-to-end tests again, with the kernel fast path on (--fast-path)"
	AGGD_E2E_DAEMON_ARGS=--fast-path $(GO) test -count=1 -timeout 20m ./test/e2e
	@echo "test: the daemon's packages again under the race detector (about a minute)"
	$(GO) test -race -count=1 -timeout 20m ./cmd/... ./internal/...

test-unit: generate ## unit tests only (no root needed for most)
	python3 scripts/install_go_test.py
	python3 test/vm/figures_test.py
	$(MAKE) --no-print-directory test-alerts
	$(GO) test -count=1 -short $(PKGS)

test-alerts: ## the Prometheus alert rules and the Grafana dashboard: parsed, checked against the daemon's metrics, evaluated
	@# A module of its own: the Prometheus server's code is a test dependency only.
	cd deploy/prometheus && $(GO) test -count=1 ./...

fuzz: generate ## run every fuzz target for FUZZTIME each (default 60s)
	@./scripts/fuzz-all.sh $${FUZZTIME:-60s}

bench: build ## run benchmarks; results in results/bench/*.json
	./scripts/bench.sh

demo: build ## bring up the virtual lab (netem links in a VM) with three links and show aggd working
	./scripts/demo.sh

test-bpf-lts: generate ## the BPF programs' in-kernel tests on the lab VM's Debian LTS kernel (6.1)
	./scripts/bpf-lts-test.sh

deb: generate ## build the Debian package: dist/aggd_<version>_<arch>.deb (static binary, units, examples)
	./scripts/build-deb.sh

test-package: generate ## build the Debian package, install it with dpkg, check it, remove it (needs root)
	./scripts/test-package.sh

lab: build ## run the lab's scenario suite (netem in a VM, 16-22 min here, LAB_TIMEOUT s at most); results in results/lab/
	test/vm/lab suite

lint: generate ## gofmt, go vet, golangci-lint
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GOBIN)/golangci-lint run $(PKGS)
	cd deploy/prometheus && $(GO) vet ./... && $(GOBIN)/golangci-lint run ./...

clean: ## remove build outputs and generated BPF objects
	rm -rf bin results dist
	find internal/bpf \( -name '*_bpfe[lb].go' -o -name '*_bpfe[lb].o' -o -name '*_bpfe[lb]_test.go' -o -name '*_bpfe[lb]_test.o' \) -delete
