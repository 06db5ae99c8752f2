#!/usr/bin/env bash
# Builds (once) and caches the real programs the e2e suite runs:
# kube-apiserver, kubectl and CoreDNS, from the Go module proxy; etcd comes from
# Debian (etcd-server). Prints the cache directory.
#
# kube-apiserver cannot be `go install`ed (k8s.io/kubernetes replaces its
# staging modules), so it is built from a small wrapper module that
# requires k8s.io/kubernetes and replaces each staging module with the
# published one of the same release.
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
COREDNS_VERSION=${COREDNS_VERSION:-v1.15.0}
CACHE=${SERVERCOUNT_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servercount-e2e}
bin=$CACHE/bin
mkdir -p "$bin"

log() { echo "e2e binaries: $*" >&2; }

# with_heartbeat WHAT CMD...: runs CMD, saying every minute that WHAT is
# still going. A cold build prints nothing for minutes; without this line
# a reader (or CI) cannot tell a slow build from a hung one. Everything
# goes to stderr: stdout is the cache directory the harness reads.
with_heartbeat() {
  local what=$1 start
  shift
  start=$(date +%s)
  (
    # The sleep is killed with the loop, so that no orphan holds the
    # output open after the build.
    trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
    while :; do
      sleep 60 &
      sleeper=$!
      wait "$sleeper"
      log "still $what ($((($(date +%s) - start) / 60)) min so far)"
    done
  ) >&2 &
  local beat=$! rc=0
  "$@" || rc=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  return "$rc"
}

if ! command -v etcd >/dev/null 2>&1; then
  log "etcd: installing etcd-server from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
fi
log "etcd: $(command -v etcd)"

# build_once NAME OUT HOW BUILDER: says OUT is cached if it is there;
# otherwise runs BUILDER, which writes OUT.tmp (HOW says how long that
# takes), and moves that to OUT only once whole, so that an interrupted
# build is never taken for a cached one.
build_once() {
  local name=$1 out=$2 how=$3 builder=$4
  if [ -x "$out" ]; then
    log "$name: cached, $out"
    return
  fi
  log "$name: building ($how, once; cached in $bin)"
  "$builder" "$out.tmp"
  mv "$out.tmp" "$out"
  log "$name: built, $out"
}

# kube_work is the wrapper module kube-apiserver and kubectl are built in.
kube_work=$CACHE/build/kube-apiserver-$KUBE_VERSION

build_kube_apiserver() {
  local out=$1 work=$kube_work staging_version=v0${KUBE_VERSION#v1}
  mkdir -p "$work"
  {
    echo "module servercount.local/kube-apiserver-build"
    echo
    echo "go 1.26"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    echo "replace ("
    for m in api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider \
      cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api \
      cri-client csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms \
      kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet \
      metrics mount-utils pod-security-admission sample-apiserver sample-cli-plugin sample-controller \
      streaming; do
      echo "	k8s.io/$m => k8s.io/$m $staging_version"
    done
    echo ")"
  } > "$work/go.mod"
  cat > "$work/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  log "kube-apiserver $KUBE_VERSION: fetching k8s.io/kubernetes and its modules"
  (cd "$work" && with_heartbeat "fetching kube-apiserver's modules" env GOFLAGS=-mod=mod go mod tidy >&2)
  log "kube-apiserver $KUBE_VERSION: compiling"
  (cd "$work" && with_heartbeat "compiling kube-apiserver $KUBE_VERSION" go build -o "$out" k8s.io/kubernetes/cmd/kube-apiserver >&2)
}

# kubectl, from the same wrapper module: the manifests test runs
# kubectl apply -k against the API server as an operator would.
build_kubectl() {
  local out=$1 work=$kube_work
  if ! grep -q cmd/kubectl "$work/tools.go"; then
    printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n\t_ "k8s.io/kubernetes/cmd/kubectl"\n)\n' > "$work/tools.go"
    (cd "$work" && GOFLAGS=-mod=mod go mod tidy >&2)
  fi
  (cd "$work" && go build -o "$out" k8s.io/kubernetes/cmd/kubectl >&2)
}

build_coredns() {
  local out=$1 tmp=$CACHE/build/coredns-$COREDNS_VERSION
  mkdir -p "$tmp"
  with_heartbeat "building CoreDNS $COREDNS_VERSION" env GOBIN="$tmp" go install "github.com/coredns/coredns@$COREDNS_VERSION" >&2
  mv "$tmp/coredns" "$out"
}

build_once "kube-apiserver $KUBE_VERSION" "$bin/kube-apiserver-$KUBE_VERSION" "about 9 minutes on 2 cores" build_kube_apiserver
build_once "kubectl $KUBE_VERSION" "$bin/kubectl-$KUBE_VERSION" "about 2 minutes on 2 cores after kube-apiserver" build_kubectl
build_once "CoreDNS $COREDNS_VERSION" "$bin/coredns-$COREDNS_VERSION" "about 5 minutes on 2 cores, fetched from the module proxy" build_coredns

echo "$CACHE"
