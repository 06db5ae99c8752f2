#!/usr/bin/env bash
# Builds (once) and caches what `make cluster-e2e` runs beside what
# binaries.sh already builds: kubelet, kube-controller-manager and
# kube-scheduler, from the Go module proxy, and installs the node's
# runtime from Debian (containerd, runc, the CNI plugins, iptables, and
# busybox-static for the test workload's image) when missing. Prints the cache directory (the same one
# binaries.sh prints; binaries.sh runs first).
#
# The wrapper module is not binaries.sh's: 1.37's kubelet imports the
# staging module k8s.io/cri-streaming, which binaries.sh's hard-coded list
# lacks (`go mod tidy` then fails with a 403 for
# k8s.io/cri-streaming@v0.0.0). Here the replace list is read from
# k8s.io/kubernetes's own go.mod (its `=> ./staging/...` lines), so it
# follows the version. Both modules resolve to the same module versions,
# so this build reuses the compiled packages of binaries.sh's in the one
# Go build cache (GOCACHE) rather than compiling them again.
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
CACHE=${SERVERCOUNT_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servercount-e2e}
here=$(cd "$(dirname "$0")" && pwd)
bin=$CACHE/bin
work=$CACHE/build/kube-node-$KUBE_VERSION
mkdir -p "$bin" "$work"

log() { echo "cluster binaries: $*" >&2; }

# The e2e suite's programs first (kube-apiserver, kubectl, CoreDNS, etcd).
bash "$here/binaries.sh" >/dev/null

# Debian packages the node runs, each installed only if missing. .ci/run
# lists the same packages.
need=()
for p in containerd runc containernetworking-plugins busybox-static iptables; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  log "installing from Debian: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

cmds=(kubelet kube-controller-manager kube-scheduler)
missing=()
for c in "${cmds[@]}"; do
  [ -x "$bin/$c-$KUBE_VERSION" ] && log "$c $KUBE_VERSION: cached, $bin/$c-$KUBE_VERSION" || missing+=("$c")
done

if [ ${#missing[@]} -gt 0 ]; then
  start=$(date +%s)
  staging_version=v0${KUBE_VERSION#v1}
  GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" > "$work/kubernetes.json"
  gomod=$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' "$work/kubernetes.json")
  mods=$(grep -E '=> \./staging' "$gomod" | awk '{print $1}')
  {
    echo "module servercount.local/kube-node-build"
    echo
    echo "go 1.26"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    echo "replace ("
    for m in $mods; do echo "	$m => $m $staging_version"; done
    echo ")"
  } > "$work/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for c in "${cmds[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
    echo ')'
  } > "$work/tools.go"
  log "fetching k8s.io/kubernetes $KUBE_VERSION's modules"
  (cd "$work" && GOFLAGS=-mod=mod go mod tidy >&2)
  # The version the binaries report (the kubelet's node status shows it).
  ldf=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf="$ldf -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2) -X $p.gitTreeState=clean"
  done
  log "compiling ${missing[*]} (about 8-11 minutes on 2 cores, once)"
  rm -rf "$work/out" && mkdir -p "$work/out"
  pkgs=()
  for c in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  # One go build for all three: the packages they share compile once.
  (cd "$work" && go build -ldflags="-s -w $ldf" -o "$work/out/" "${pkgs[@]}" >&2)
  for c in "${missing[@]}"; do mv "$work/out/$c" "$bin/$c-$KUBE_VERSION"; done
  log "built ${missing[*]} in $(( $(date +%s) - start )) s"
fi

echo "$CACHE"
