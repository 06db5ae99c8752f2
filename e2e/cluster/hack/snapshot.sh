#!/usr/bin/env bash
# snapshot.sh DIR: writes what the end-of-run check compares into DIR, one
# file per kind: links, addresses, routes (every table), iptables and
# ip6tables rules, the sysctls the node changes, mounts, cgroups the
# kubelet makes, the node's processes, and the paths outside the state
# directory that the kubelet and containerd write. Taken before up.sh and
# after down.sh; `diff -r` of the two must be empty.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
out=$1
mkdir -p "$out"
ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort >"$out/links"
ip -o addr show | awk '{print $2, $3, $4}' | sort >"$out/addresses"
{ ip route show table all; ip -6 route show table all; } | sort >"$out/routes"
# Rules only: counters and the save's timestamps change on their own.
for ipt in iptables ip6tables; do
  for t in filter nat mangle raw; do
    echo "# $t"
    $ipt-save -t "$t" 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//'
  done >"$out/$ipt"
done
sysctl -e vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys \
  kernel.keys.root_maxbytes net.ipv4.ip_forward net.ipv6.conf.all.forwarding net.ipv4.conf.all.forwarding \
  net.ipv4.conf.default.forwarding net.ipv4.conf.all.route_localnet net.bridge.bridge-nf-call-iptables \
  2>/dev/null >"$out/sysctls" || true
awk '{print $2, $3}' /proc/self/mounts | sort >"$out/mounts"
find /sys/fs/cgroup -maxdepth 2 \( -name 'kubepods*' -o -name k8s.io \) 2>/dev/null | sort >"$out/cgroups"
# The node's processes: anything whose command line names the state
# directory or our containerd socket. The machine is shared, so other
# etcds and kube-apiservers (the e2e suite's) are not the node's.
for p in /proc/[0-9]*; do
  c=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
  case $c in *"$S"*) echo "${p#/proc/} $c" ;; esac
done | grep -v -e "snapshot.sh" | sort >"$out/processes" || true
for d in /var/lib/cni /var/log/containers /var/log/pods /var/lib/kubelet /run/containerd /var/lib/containerd \
  /etc/cni /opt/cni /usr/libexec/kubernetes /etc/kubernetes; do
  [ -e "$d" ] && find "$d" -maxdepth 3 2>/dev/null | sort
done >"$out/files"
# Shared with other tools (kubectl's cache, buildah's storage): the top
# level only, which the node would change if it wrote there.
for d in /root/.kube /var/lib/containers; do
  [ -e "$d" ] && find "$d" -maxdepth 1 2>/dev/null | sort
done >>"$out/files"
