#!/usr/bin/env bash
# make cluster-e2e: builds what the node runs (once, cached by version),
# records the machine's state, starts the node, runs the Go tests of
# e2e/cluster against it, tears it down, and fails if the machine is not
# as it was. Whatever happens after the node starts, the teardown and the
# check run (trap). Prints the time of each stage.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
root=$(dirname "$S")
t0=$(date +%s)
stage_start=$t0
stage() { # stage NAME: ends the stage before, starts NAME
  local now
  now=$(date +%s)
  echo "cluster-e2e: [+$((now - t0))s] $1 (previous stage: $((now - stage_start))s)" >&2
  stage_start=$now
}

if [ "$(id -u)" != 0 ]; then
  echo "cluster-e2e: needs root (containerd, bridges, iptables)" >&2
  exit 1
fi
if [ -e "$S" ]; then
  echo "cluster-e2e: $S exists: a node is running or was left behind; run $here/down.sh first" >&2
  exit 1
fi

stage "build: Kubernetes binaries and CoreDNS (cached by version), Debian packages if missing"
nice -n 19 bash "$here/../../hack/node-binaries.sh" >/dev/null

stage "snapshot of the machine before"
rm -rf "$root/before" "$root/after"
mkdir -p "$root"
bash "$here/snapshot.sh" "$root/before"

rc=0
finish() {
  local code=$?
  [ "$rc" = 0 ] && rc=$code
  stage "teardown"
  KEEP_STATE=${KEEP_STATE:-0} bash "$here/down.sh" || rc=1
  stage "snapshot of the machine after, compared"
  bash "$here/snapshot.sh" "$root/after"
  if diff -r "$root/before" "$root/after" >"$root/machine.diff"; then
    echo "cluster-e2e: the machine is as it was" >&2
    rm -rf "$root/before" "$root/after" "$root/machine.diff"
    [ -d "$S" ] || rmdir "$root" 2>/dev/null || true
  else
    echo "cluster-e2e: FAIL: the machine differs from before the run ($root/machine.diff):" >&2
    cat "$root/machine.diff" >&2
    rc=1
  fi
  stage "done: $([ "$rc" = 0 ] && echo PASS || echo FAIL)"
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

stage "images: make images (buildah), pause, busybox"
bash "$here/images.sh"
stage "node: up.sh"
bash "$here/up.sh"
stage "tests: go test ./cluster"
cd "$here/../.."
CLUSTER_E2E_KUBECTL="$BIN/kubectl-$KUBE_VERSION" CLUSTER_E2E_KUBECONFIG="$E/admin.kubeconfig" \
  nice -n 19 go test -count=1 -v -timeout 20m ./cluster/ || rc=$?
