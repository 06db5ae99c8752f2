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

apiserver=$bin/kube-apiserver-$KUBE_VERSION
if [ -x "$apiserver" ]; then
  log "kube-apiserver $KUBE_VERSION: cached, $apiserver"
else
  log "kube-apiserver $KUBE_VERSION: building (about 9 minutes on 2 cores, once; cached in $bin)"
  work=$CACHE/build/kube-apiserver-$KUBE_VERSION
  mkdir -p "$work"
  staging_version=v0${KUBE_VERSION#v1}
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
  (cd "$work" && with_heartbeat "compiling kube-apiserver $KUBE_VERSION" go build -o "$apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver >&2)
  mv "$apiserver.tmp" "$apiserver"
  log "kube-apiserver $KUBE_VERSION: built, $apiserver"
fi

# kubectl, from the same wrapper module: the manifests test runs
# kubectl apply -k against the API server as an operator would.
kubectl=$bin/kubectl-$KUBE_VERSION
if [ -x "$kubectl" ]; then
  log "kubectl $KUBE_VERSION: cached, $kubectl"
else
  log "kubectl $KUBE_VERSION: building (about 2 minutes on 2 cores after kube-apiserver, once; cached in $bin)"
  work=$CACHE/build/kube-apiserver-$KUBE_VERSION
  if ! grep -q cmd/kubectl "$work/tools.go"; then
    printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n\t_ "k8s.io/kubernetes/cmd/kubectl"\n)\n' > "$work/tools.go"
    (cd "$work" && GOFLAGS=-mod=mod go mod tidy >&2)
  fi
  (cd "$work" && go build -o "$kubectl.tmp" k8s.io/kubernetes/cmd/kubectl >&2)
  mv "$kubectl.tmp" "$kubectl"
  log "kubectl $KUBE_VERSION: built, $kubectl"
fi

coredns=$bin/coredns-$COREDNS_VERSION
if [ -x "$coredns" ]; then
  log "CoreDNS $COREDNS_VERSION: cached, $coredns"
else
  log "CoreDNS $COREDNS_VERSION: fetching and building (about 5 minutes on 2 cores, once; cached in $bin)"
  tmp=$CACHE/build/coredns-$COREDNS_VERSION
  mkdir -p "$tmp"
  with_heartbeat "building CoreDNS $COREDNS_VERSION" env GOBIN="$tmp" go install "github.com/coredns/coredns@$COREDNS_VERSION" >&2
  mv "$tmp/coredns" "$coredns"
  log "CoreDNS $COREDNS_VERSION: built, $coredns"
fi

echo "$CACHE"
