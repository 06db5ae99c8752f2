# servercount: the same commands for everyone, CI included.

GO          ?= go
BIN         := $(CURDIR)/bin
STATICCHECK := $(BIN)/staticcheck
STATICCHECK_VERSION := v0.8.2

.PHONY: all build test lint bench demo demo-probe clean certs e2e

all: lint test build

## build: the binaries, into ./bin
build:
	$(GO) build -o $(BIN)/ ./cmd/...

## test: every test, with the race detector and a leak check in each package
test:
	$(GO) test -race -count=1 -timeout 9m ./...

## lint: gofmt, go vet and staticcheck
lint: $(STATICCHECK)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...
	cd e2e && $(GO) vet ./...

$(STATICCHECK):
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

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
# -v and a single package: only then does go test pass the suite's output
# through as it comes (with several packages, or without -v, it holds it
# until the package ends), so a cold run says which binary it is building
# and each scenario as it starts and ends instead of nothing for 20
# minutes. e2e/harness has no tests of its own; `make lint` vets it.
e2e:
	@echo "e2e: compiling the suite (the first time: a few minutes for client-go)" >&2
	cd e2e && $(GO) test -v -count=1 -timeout 45m .
