# servercount: the same commands for everyone, CI included.

GO          ?= go
BIN         := $(CURDIR)/bin
STATICCHECK := $(BIN)/staticcheck
STATICCHECK_VERSION := v0.8.2

# The version and commit that --version and servercount_build_info report.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS  := -s -w -X github.com/servercount/servercount/internal/version.version=$(VERSION) \
	-X github.com/servercount/servercount/internal/version.revision=$(REVISION)

.PHONY: all build test lint bench demo demo-probe clean certs e2e fuzz soak

all: lint test build

## build: the binaries, into ./bin
build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

## test: every test, with the race detector and a leak check in each package,
## then each fuzz target for a few seconds beyond its checked-in seeds
test:
	$(GO) test -race -count=1 -timeout 9m ./...
	$(MAKE) --no-print-directory fuzz FUZZTIME=3s

# FUZZ lists the fuzz targets as package:Target.
FUZZ := \
	./pkg/servercounter:FuzzDNSCountAnswer \
	./pkg/servercounter:FuzzClassify \
	./cmd/servercount/app:FuzzProbeArgs
FUZZTIME ?= 60s

## fuzz: each fuzz target for FUZZTIME (default 60s); failures land in testdata/fuzz
fuzz:
	@set -e; for t in $(FUZZ); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$fn in $$pkg for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

## lint: gofmt, go vet and staticcheck
lint: $(STATICCHECK)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...
	cd e2e && $(GO) vet ./...

$(STATICCHECK):
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

## soak: the binaries under thousands of normal, slow, vanishing and hostile
## peers for SOAK_DURATION (default 2m); then every resource must come back
SOAK_DURATION ?= 2m
soak:
	SOAK_DURATION=$(SOAK_DURATION) $(GO) test -count=1 -v -timeout 15m -run TestSoak ./internal/soak

## bench: the benchmarks quoted in the README
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 3 ./pkg/...

## demo: an agent following proxy-servers as they scale 3 -> 5 -> 2, through DNS
demo:
	$(GO) run ./examples/demo

## demo-probe: the servercount probe against an embedded DNS server while a Service scales
demo-probe:
	$(GO) run ./examples/probe

clean:
	rm -rf $(BIN)

## certs: a local CA and certificates for a server, an agent and a client, in ./certs
certs:
	$(GO) run ./examples/certs certs

## e2e: end-to-end scenarios against real etcd, kube-apiserver and CoreDNS
## (builds and caches kube-apiserver and CoreDNS under ~/.cache the first
## time: about 15 minutes on 2 cores; then about 2 minutes). Needs root for
## its network namespace.
e2e:
	cd e2e && $(GO) test -count=1 -timeout 45m ./...
