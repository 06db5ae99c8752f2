#!/usr/bin/env bash
# Stops what up.sh started, by the PIDs it kept, and undoes its mounts,
# links, routes, iptables rules, cgroups, sysctls and the files the
# kubelet and containerd write outside the state directory. Safe to run
# twice, and after a partial up.sh. KEEP_STATE=1 keeps the state
# directory (logs, etcd data) for a post-mortem; by default it goes,
# but for the build cache, which lives elsewhere.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
t0=$(date +%s)
log() { echo "[down +$(($(date +%s) - t0))s] $*" >&2; }
alive() { [ -f "$PIDS/$1" ] && kill -0 "$(cat "$PIDS/$1")" 2>/dev/null; }

# stop NAME [GRACE]: SIGTERM to the PID up.sh kept, SIGKILL after GRACE
# seconds (default 20).
stop() {
  local n=$1 grace=${2:-20} pid deadline
  if ! alive "$n"; then
    rm -f "$PIDS/$n"
    return
  fi
  pid=$(cat "$PIDS/$n")
  kill -TERM "$pid"
  deadline=$(($(date +%s) + grace))
  while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    log "$n ($pid) still running after ${grace}s: SIGKILL"
    kill -KILL "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$PIDS/$n"
  log "stopped $n ($pid)"
}

K="$KUBECTL --request-timeout=10s"
# 1. The kubelet tears the pods down through the CRI (CNI DEL, unmounts)
# while it still runs: controllers first, so that nothing comes back.
if alive kubelet && alive kube-apiserver; then
  $K delete deploy,ds,rs,sts,jobs --all -A --cascade=orphan --wait=false >/dev/null 2>&1
  $K delete pods --all -A --grace-period=1 --wait=false >/dev/null 2>&1
  deadline=$(($(date +%s) + 60))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    n=$($K get pods -A --no-headers 2>/dev/null | wc -l)
    [ "$n" = 0 ] && break
    sleep 0.5
  done
  log "pods left: $($K get pods -A --no-headers 2>/dev/null | wc -l)"
fi
stop kubelet
# 2. Whatever sandboxes remain: their tasks killed and removed through
# containerd.
if alive containerd; then
  for t in $($CTR task ls -q 2>/dev/null); do $CTR task kill -s SIGKILL "$t" >/dev/null 2>&1; done
  deadline=$(($(date +%s) + 10))
  while [ -n "$($CTR task ls -q 2>/dev/null | head -1)" ] && [ "$(date +%s)" -lt "$deadline" ]; do
    for t in $($CTR task ls -q 2>/dev/null); do $CTR task rm -f "$t" >/dev/null 2>&1; done
    sleep 0.2
  done
  for c in $($CTR c ls -q 2>/dev/null); do $CTR c rm "$c" >/dev/null 2>&1; done
fi
stop coredns 10
stop kube-scheduler 10
stop kube-controller-manager 10
# kube-apiserver waits up to 60 s for long-lived connections on SIGTERM.
stop kube-apiserver 10
stop etcd
stop containerd
# A shim outlives containerd: end those started for our socket, by PID.
for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $S/containerd/containerd.sock"); do
  log "leftover shim $pid: SIGKILL"
  kill -KILL "$pid"
done

# 3. Mounts under the state directory (netns, rootfs, volumes), deepest first.
for m in $(awk -v s="$S/" 'index($2, s) == 1 {print $2}' /proc/self/mounts | sort -r); do
  umount "$m" 2>/dev/null || umount -l "$m"
  log "unmounted $m"
done

# 4. Network: the two bridges (the pod bridge takes its veths with it),
# the route, the fences.
for v in $(ip -o link show master "$POD_BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
  ip link del "$v" && log "deleted $v"
done
ip link del "$POD_BRIDGE" 2>/dev/null && log "deleted $POD_BRIDGE"
ip link del "$NODE_LINK" 2>/dev/null && log "deleted $NODE_LINK"
ip route del unreachable "$SVC_CIDR" 2>/dev/null && log "deleted unreachable $SVC_CIDR"
for ipt in iptables ip6tables; do
  for chain in FORWARD OUTPUT; do
    while rule=$($ipt -S "$chain" | grep -m1 -- "--comment $FENCE"); do
      # shellcheck disable=SC2086 # the rule's words are the arguments
      eval "$ipt -D ${rule#-A }" && log "$ipt: removed $rule"
    done
  done
done

# 5. cgroups the kubelet and containerd made, deepest first.
for d in $(find /sys/fs/cgroup/*/kubepods* /sys/fs/cgroup/*/k8s.io -depth -type d 2>/dev/null); do
  rmdir "$d" 2>/dev/null
done

# 6. The sysctls the kubelet and the bridge plugin changed.
if [ -f "$S/state.sysctl" ]; then
  sysctl -q -p "$S/state.sysctl" && log "sysctls restored"
  rm -f "$S/state.sysctl"
fi

# 7. Files outside the state directory that no flag moves: the CNI
# results cache, the kubelet's log links, its device-plugin socket, the
# shims' sockets.
rm -rf /var/lib/cni/results /var/lib/cni/networks/servercount-e2e
rmdir /var/lib/cni/networks /var/lib/cni 2>/dev/null
find /var/log/containers -maxdepth 1 -lname "$S/*" -delete 2>/dev/null
rmdir /var/log/containers 2>/dev/null
rm -f /var/lib/kubelet/device-plugins/kubelet.sock
rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet 2>/dev/null
rmdir /usr/libexec/kubernetes/kubelet-plugins/volume/exec /usr/libexec/kubernetes/kubelet-plugins/volume \
  /usr/libexec/kubernetes/kubelet-plugins /usr/libexec/kubernetes 2>/dev/null
[ -d /run/containerd ] && find /run/containerd -depth -type d -empty -delete 2>/dev/null

if [ "${KEEP_STATE:-0}" != 1 ]; then
  if awk -v s="$S/" 'index($2, s) == 1' /proc/self/mounts | grep -q .; then
    log "mounts remain under $S: state kept"
  else
    rm -rf "$S"
    log "removed $S"
  fi
fi
log "done"
