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

.PHONY: help ci ci-checks deps integrity flood clock-step docs dashboard bench-upstream all build test lint bench bench-fleet bench-tunnel demo demo-probe clean certs e2e fuzz soak churn faults upstream upstream-suite parity cross images push image-test rules-test cluster-e2e

all: lint test build

## help: this list
help:
	@awk '/^## /{sub(/^## /, ""); if ($$0 ~ /^[a-z-]+:/) print ""; print "  " $$0}' $(MAKEFILE_LIST)

## ci: every check CI runs: `make deps` (the one step that uses the
## network), then, in a network namespace with loopback only (.ci/offline),
## ci-checks
ci: deps
	.ci/offline $(MAKE) ci-checks

## ci-checks: the checks, in order: lint, test (the README's test
## command), churn, integrity, flood, clock-step, soak, the fault matrix,
## upstream's suite, parity, the rules, the images, e2e, cluster-e2e;
## refuses to run outside the namespace that `make ci` makes
ci-checks:
	.ci/offline --check
	$(MAKE) lint
	$(MAKE) test
	$(MAKE) churn CHURN_DURATION=20s
	$(MAKE) integrity
	$(MAKE) flood
	$(MAKE) clock-step
	$(MAKE) soak
	$(MAKE) faults
	$(MAKE) upstream-suite
	$(MAKE) parity
	$(MAKE) rules-test
	$(MAKE) image-test
	$(MAKE) e2e
	$(MAKE) cluster-e2e

## deps: fetch and build everything the checks need, so that they run
## without a network: the Go modules of the three modules, staticcheck,
## upstream's binaries (make upstream), and e2e's etcd (from Debian),
## kube-apiserver, kubectl and CoreDNS (e2e/hack/binaries.sh; about 15
## minutes the first time, cached after), and the node's kubelet,
## kube-controller-manager, kube-scheduler, containerd and CNI plugins
## (e2e/hack/node-binaries.sh; about 8 minutes more the first time)
deps: $(STATICCHECK)
	$(GO) mod download
	cd e2e && $(GO) mod download
	cd examples/grafana && $(GO) mod download
	@rc=0; $(GO) run ./test/upstream/cmd/upstream-bin >/dev/null || rc=$$?; \
	if [ $$rc -ne 0 ] && [ $$rc -ne 3 ]; then exit $$rc; fi
	bash e2e/hack/binaries.sh >/dev/null
	bash e2e/hack/node-binaries.sh >/dev/null

## build: the binaries, into ./bin
build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

## test: every test, with the race detector and a leak check in each package,
## then each fuzz target for a few thousand inputs beyond its checked-in seeds
# Counts, not durations: Go 1.26's fuzz coordinator can report "context
# deadline exceeded" as a failure when a -fuzztime duration ends while a
# starved worker is mid-input (golang/go#75804, fixed in Go 1.27); a count
# has no deadline to race on a loaded machine.
test:
	$(GO) test -race -count=1 -timeout 9m ./...
	$(GO) test -count=1 -run '$(RACE_FREE_TESTS)' ./pkg/server
	cd examples/grafana && $(GO) test -count=1 ./...
	$(MAKE) --no-print-directory fuzz FUZZTIME=5000x FUZZTIME_REAL=300x

# RACE_FREE_TESTS run a second time without the race detector: they look
# for an interleaving a few instructions wide, which the detector's
# slowdown of the test's own side mostly hides.
RACE_FREE_TESTS := ^(TestHTTPWriterWritesWhatCameBeforeCloseRsp|TestPlainAgentStreamingAsFrontendClosesGetsCloseLater)$$

# FUZZ lists the fuzz targets as package:Target.
FUZZ := \
	./pkg/servercounter:FuzzDNSCountAnswer \
	./pkg/servercounter:FuzzClassify \
	./cmd/servercount/app:FuzzProbeArgs \
	./pkg/server:FuzzHTTPConnectRequest \
	./pkg/server:FuzzHandshake \
	./pkg/agent:FuzzParseHandshake \
	./pkg/wire:FuzzCodec \
	./pkg/server:FuzzAgentPackets \
	./pkg/agent:FuzzServerPackets
FUZZTIME ?= 60s
# FUZZTIME_REAL is the budget of the targets that run real connections
# (each input takes milliseconds, not microseconds).
FUZZTIME_REAL ?= $(FUZZTIME)
# FUZZ_REAL_CONNECTIONS run a real server or agent: goroutine scheduling
# makes their coverage differ from run to run, so most inputs look new
# once and the fuzzer would spend the run minimizing inputs whose coverage
# does not come back (60 s each by default). They get a few runs instead.
FUZZ_REAL_CONNECTIONS := FuzzAgentPackets FuzzServerPackets

## fuzz: each fuzz target for FUZZTIME (default 60s); failures land in testdata/fuzz
fuzz:
	@set -e; for t in $(FUZZ); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		budget=$(FUZZTIME); extra=; \
		case " $(FUZZ_REAL_CONNECTIONS) " in *" $$fn "*) budget=$(FUZZTIME_REAL); extra="-fuzzminimizetime 10x";; esac; \
		echo "fuzz $$fn in $$pkg for $$budget"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $$budget $$extra $$pkg; \
	done

## lint: gofmt, go vet and staticcheck
lint: $(STATICCHECK)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...
	cd e2e && $(GO) vet ./...
	cd examples/grafana && $(GO) vet ./... && $(STATICCHECK) ./...

$(STATICCHECK):
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# Container images: one per binary, for every platform, as one index each.
IMAGES    := proxy-server proxy-agent servercount
PLATFORMS := linux/amd64 linux/arm64
REGISTRY  ?= ghcr.io/servercount
IMAGE_TAG ?= $(VERSION)
OCI_DIR   := $(BIN)/images
# buildah's storage driver: vfs works everywhere, overlay is faster where
# the kernel allows it.
STORAGE_DRIVER ?= vfs
BUILDAH := buildah --storage-driver=$(STORAGE_DRIVER)
# docker only with an engine and buildx; else buildah.
CONTAINER_TOOL ?= $(shell docker info >/dev/null 2>&1 && docker buildx version >/dev/null 2>&1 && echo docker || echo buildah)

## cross: static binaries for every image platform, into bin/linux_<arch>/
cross:
	@set -e; for p in $(PLATFORMS); do \
		arch=$${p#linux/}; \
		echo "build $$p"; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/linux_$$arch/ ./cmd/...; \
	done

## images: the images, with docker (buildx) or buildah, one OCI archive each
## in bin/images; the same commit gives the same digests
images: cross
	@mkdir -p $(OCI_DIR)
	@set -e; for img in $(IMAGES); do \
		name=$(REGISTRY)/$$img:$(IMAGE_TAG); \
		if [ "$(CONTAINER_TOOL)" = docker ]; then \
			SOURCE_DATE_EPOCH=0 docker buildx build --target $$img --platform $$(echo $(PLATFORMS) | tr ' ' ,) \
				--build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t $$name \
				--output type=oci,dest=$(OCI_DIR)/$$img.oci.tar,rewrite-timestamp=true . ; \
		else \
			$(BUILDAH) manifest rm $$name >/dev/null 2>&1 || true; \
			$(BUILDAH) manifest create $$name >/dev/null; \
			for p in $(PLATFORMS); do \
				$(BUILDAH) bud --quiet --timestamp 0 --manifest $$name --platform $$p --target $$img \
					--build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) . >/dev/null; \
			done; \
			rm -f $(OCI_DIR)/$$img.oci.tar; \
			$(BUILDAH) manifest push --all --quiet --digestfile $(OCI_DIR)/$$img.digest $$name oci-archive:$(OCI_DIR)/$$img.oci.tar; \
			echo "$$name $$(cat $(OCI_DIR)/$$img.digest)"; \
		fi; \
	done

## push: the images to REGISTRY (make push REGISTRY=registry.example.com/me)
push: images
	@set -e; for img in $(IMAGES); do \
		name=$(REGISTRY)/$$img:$(IMAGE_TAG); \
		if [ "$(CONTAINER_TOOL)" = docker ]; then \
			docker buildx build --target $$img --platform $$(echo $(PLATFORMS) | tr ' ' ,) \
				--build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t $$name --push . ; \
		else \
			$(BUILDAH) manifest push --all $$name docker://$$name; \
		fi; \
	done

## rules-test: promtool checks and unit-tests the Prometheus rules
rules-test:
	cd examples/prometheus && promtool check rules servercount-rules.yaml && promtool test rules servercount-rules_test.yaml

## image-test: build the images twice (same digests), then run them with podman
image-test:
	bash .ci/image-test

## soak: the binaries under thousands of normal, slow, vanishing and hostile
## peers for SOAK_DURATION (default 2m), then every resource must come back;
## then the churn (make churn, in process) for CHURN_SOAK_DURATION (default 1m) in each
## frontend mode and window setting
SOAK_DURATION ?= 2m
CHURN_SOAK_DURATION ?= 1m
soak:
	SOAK_DURATION=$(SOAK_DURATION) $(GO) test -count=1 -v -timeout 15m -run TestSoak ./test/soak
	$(GO) test -count=1 -v -timeout 30m -run '^TestChurn$$' ./internal/proxytest -churn.duration=$(CHURN_SOAK_DURATION)

## churn: tunnels opened and closed from both ends through the binaries as processes, ours and
## upstream's in all four pairings, both frontend modes, CHURN_DURATION
## (default 60s) each; builds upstream's binaries once (see make upstream)
CHURN_DURATION ?= 60s
churn:
	$(GO) test -count=1 -v -timeout 40m -run TestChurnProcesses ./test/churn -churn.process-duration=$(CHURN_DURATION)

## integrity: every byte of every tunnel, both ways, checked at both ends,
## through the binaries as processes in all four pairings with upstream's,
## over HTTP CONNECT, a gRPC connection per tunnel and one shared gRPC
## connection; our pair must deliver every tunnel; writes the table to
## integrity.md
integrity:
	$(GO) test -count=1 -v -timeout 30m -run TestIntegrityProcesses ./test/churn -integrity -integrity.out=$(CURDIR)/integrity.md

## flood: a proxy-server process under a flood of bogus agent handshakes,
## each stream followed by a stream window of data, from one address and
## from 50, with TokenReviews that take 5 s: heap bounded, the API server
## never past 32 reviews, and 16 of 20 real agents in within 17 s
flood:
	$(GO) test -count=1 -v -timeout 15m -run TestFloodProcesses ./test/fleet -flood.processes

## clock-step: steps this machine's wall clock an hour forward and back
## under a running proxy-server and proxy-agent (as root): no stream ends,
## and each half still drops a stopped peer in seconds; runs alone
clock-step:
	$(GO) test -count=1 -v -timeout 5m -run TestWallClockSteps ./test/clockstep -clock.step

## faults: the fault matrix: servers frozen, black-holed, cut off
## and stopped, agents stopped and deaf, through our binaries (held to the
## issue's bounds) and upstream's (measured), as processes; needs root for
## its network namespaces; writes the table to faults.md
faults:
	$(GO) test -count=1 -v -timeout 25m -parallel 8 -run TestFaultMatrix ./test/faults -faults -faults.out=$(CURDIR)/faults.md

## upstream-suite: upstream's own integration suite (its ./tests) against
## our proxy-agent; every test must pass but the one that fails here with
## upstream's agent too (skips, with one line, without upstream's source)
upstream-suite:
	$(GO) build -o $(BIN)/ ./cmd/proxy-agent
	@rc=0; $(GO) run ./test/upstream/cmd/upstream-suite -agent-path=$(BIN)/proxy-agent || rc=$$?; \
	if [ $$rc -eq 3 ]; then exit 0; fi; exit $$rc

## parity: the same scenarios through upstream's binaries and ours; a
## difference not in docs/differences.md fails
parity:
	$(GO) test -count=1 -v -timeout 20m ./test/parity -parity

## docs: write the generated references in docs/ (flags.md, metrics.md) again; make
## test fails when they differ from the code
docs:
	$(GO) test -count=1 ./hack/docgen -update

## dashboard: write examples/grafana/servercount.json again from its Go
## code; make test fails when they differ
dashboard:
	cd examples/grafana && $(GO) run .

## upstream: build upstream's server, agent, test-client and test-server from
## ../shared/upstream (or $$SERVERCOUNT_UPSTREAM_SRC) into ~/.cache, once, and
## print their directory
upstream:
	@$(GO) run ./test/upstream/cmd/upstream-bin

## bench: the benchmarks quoted in docs/benchmarks.md
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 3 ./pkg/...

## bench-fleet: a fleet of agents (1000 unless BENCH_FLEET_FLAGS says
## -fleet.agents=N) against proxy-servers in this process: cold start,
## scale through DNS, rolling replacement, a steady minute, memory per stream
bench-fleet:
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 30m ./test/fleet/ $(BENCH_FLEET_FLAGS)

## bench-tunnel: tunnel throughput and time to first byte through the built
## proxy-server and proxy-agent as processes, as ratios to a direct
## connection in the same run (BENCH_TUNNEL_FLAGS=-tunnelbench.profile=/abs/dir
## also writes CPU profiles of both)
bench-tunnel:
	$(GO) test -run '^$$' -bench '^BenchmarkTunnel$$' -benchtime 1x -count 1 -timeout 30m ./test/tunnelbench/ $(BENCH_TUNNEL_FLAGS)

## bench-upstream: our binaries and upstream's (built from ../shared/upstream)
## side by side in one run: new tunnels to first byte and throughput in both
## frontend modes, ratios to upstream and to a direct connection, the load
## of each run, the dial's floor (crossings between processes), CPU per
## tunnel and per GB; then what an idle open tunnel costs each process
## (RSS, heap, goroutines) with as many open at once as the file limit
## allows (up to 20000); the tables go to bench-upstream.md and a chart of the
## dial latencies to bench-upstream.png (or $$BENCH_CHART).
## BENCH_PROFILE=dir also writes CPU profiles of our server and agent and
## execution traces of every process, and counts wake-ups per tunnel;
## BENCH_BURNERS=n runs n CPU burners beside it, for the tail under load.
bench-upstream:
	rm -f $(CURDIR)/bench-upstream.md
	$(GO) test -run '^$$' -bench Upstream -benchtime 1x -count 1 -timeout 60m ./test/tunnelbench/ \
		-tunnelbench.out=$(CURDIR)/bench-upstream.md -tunnelbench.chart=$(abspath $(or $(BENCH_CHART),bench-upstream.png)) \
		$(if $(BENCH_PROFILE),-tunnelbench.profile=$(abspath $(BENCH_PROFILE))) \
		$(if $(BENCH_BURNERS),-tunnelbench.burners=$(BENCH_BURNERS))

## demo: an agent following proxy-servers as they scale 3 -> 5 -> 2, through DNS;
## writes a chart of its counts to demo.png (or $$DEMO_CHART)
demo:
	$(GO) run ./examples/demo -chart $(or $(DEMO_CHART),demo.png)

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

## cluster-e2e: examples/kubernetes on a real one-node cluster (kubelet,
## containerd, kube-controller-manager, CoreDNS), kube-apiserver's egress
## through the proxy-server and agent pods: logs, exec, port-forward, the
## server Deployment scaled 1 -> 3 -> 2 and rollout-restarted with every
## agent following.
## Root; builds and caches kubelet, kube-controller-manager and
## kube-scheduler the first time; leaves the machine as it found it
## (checked). The last of make ci's checks. See e2e/cluster/README.md.
cluster-e2e:
	bash e2e/cluster/hack/run.sh
