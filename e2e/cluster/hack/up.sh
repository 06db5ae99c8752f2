#!/usr/bin/env bash
# Starts the one-node cluster of `make cluster-e2e` under the state
# directory: the network fences, containerd (with the image-pull fence),
# etcd, kube-apiserver (egress through the proxy-server's socket from its
# start), kube-controller-manager, kube-scheduler, the kubelet and CoreDNS
# on the node address. Every daemon's PID goes to $PIDS/<name>; down.sh
# stops them by that PID and undoes what this script did. Needs the
# binaries (node-binaries.sh) and the images (images.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
PROJECT=$(cd "$here/../../.." && pwd)
mkdir -p "$E" "$L" "$PIDS" "$P" "$KN/pki" "$KN/uds" "$S/cni/net.d" "$S/cni/ipam" "$S/kubelet" \
  "$S/kubelet-logs" "$S/containerd/root" "$S/containerd/state" "$S/containerd/runc"
t0=$(date +%s)
log() { echo "[up +$(($(date +%s) - t0))s] $*" >&2; }

# start NAME CMD...: CMD in the background, its output in $L/NAME.log,
# its PID in $PIDS/NAME (setsid: its own process group, not the caller's).
start() {
  local n=$1
  shift
  setsid "$@" >>"$L/$n.log" 2>&1 </dev/null &
  echo $! >"$PIDS/$n"
  log "$n started, pid $!"
}

# wait_for WHAT SECONDS CMD...: runs CMD until it succeeds, for at most
# SECONDS (a deadline, not a count of tries).
wait_for() {
  local what=$1 secs=$2 deadline
  shift 2
  deadline=$(($(date +%s) + secs))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log "timed out after ${secs}s waiting for $what"
      return 1
    fi
    sleep 0.2
  done
  log "$what ready"
}

# --- PKI: a CA, serving and client certificates, service-account keys ---
cert() { # cert NAME SUBJECT [SAN]
  local n=$1 subj=$2 san=${3:-} ext
  openssl req -newkey rsa:2048 -nodes -keyout "$P/$n.key" -out "$P/$n.csr" -subj "$subj" 2>/dev/null
  if [ -n "$san" ]; then
    ext="subjectAltName=$san"$'\n'"extendedKeyUsage=serverAuth,clientAuth"$'\n'"keyUsage=critical,digitalSignature,keyEncipherment"
  else
    ext="extendedKeyUsage=clientAuth"$'\n'"keyUsage=critical,digitalSignature,keyEncipherment"
  fi
  openssl x509 -req -in "$P/$n.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -out "$P/$n.crt" \
    -days 7 -extfile <(echo "$ext") 2>/dev/null
  rm "$P/$n.csr"
}
kubeconfig() { # kubeconfig WHO: a kubeconfig with WHO's client certificate
  cat >"$E/$1.kubeconfig" <<K
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://$NODE_IP:$API_PORT", certificate-authority-data: $(base64 -w0 "$P/ca.crt")}
users:
- name: $1
  user: {client-certificate-data: $(base64 -w0 "$P/$1.crt"), client-key-data: $(base64 -w0 "$P/$1.key")}
contexts:
- name: local
  context: {cluster: local, user: $1}
current-context: local
K
}
if ! [ -f "$P/done" ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$P/ca.key" -out "$P/ca.crt" -days 7 -subj "/CN=servercount-cluster-e2e-ca" 2>/dev/null
  cert apiserver "/CN=kube-apiserver" "IP:127.0.0.1,IP:$NODE_IP,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  cert admin "/O=system:masters/CN=cluster-e2e-admin"
  cert controller-manager "/CN=system:kube-controller-manager"
  cert scheduler "/CN=system:kube-scheduler"
  cert kubelet-client "/O=system:nodes/CN=system:node:$NODE"
  cert kubelet-serving "/O=system:nodes/CN=system:node:$NODE" "IP:$NODE_IP,DNS:$NODE"
  # The proxy-servers' agent-facing certificate: valid for the name the
  # agents use as --proxy-server-host (the manifests' comment asks for it).
  cert konnectivity-server-tls "/CN=konnectivity-server" "DNS:konnectivity-server.kube-system.svc.cluster.local,DNS:konnectivity-server-lb.kube-system.svc.cluster.local"
  # The proxy-servers' client certificate for TokenReviews (rbac.yaml binds
  # this user to system:auth-delegator).
  cert konnectivity-server "/CN=system:konnectivity-server"
  openssl genrsa -out "$P/sa.key" 2048 2>/dev/null
  openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
  for who in admin controller-manager scheduler kubelet-client konnectivity-server; do kubeconfig "$who"; done
  # What the server pods mount (hostPath): the certificate pair under the
  # names the manifest's flags use, and the kubeconfig.
  cp "$P/konnectivity-server-tls.crt" "$KN/pki/apiserver.crt"
  cp "$P/konnectivity-server-tls.key" "$KN/pki/apiserver.key"
  cp "$E/konnectivity-server.kubeconfig" "$KN/konnectivity-server.conf"
  touch "$P/done"
  log "PKI made"
fi

# --- network fences (down.sh undoes exactly these) ---
uplink=$(ip route show default | awk '{print $5; exit}')
echo "$uplink" >"$S/state.uplink"
# The sysctls the kubelet and the bridge plugin change, as they were.
[ -f "$S/state.sysctl" ] || sysctl -e vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops \
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward net.ipv6.conf.all.forwarding >"$S/state.sysctl"
if ! ip link show "$NODE_LINK" >/dev/null 2>&1; then
  ip link add "$NODE_LINK" type bridge
  ip addr add "$NODE_IP/32" dev "$NODE_LINK"
  ip link set "$NODE_LINK" up
fi
ip route show type unreachable | grep -q "^unreachable $SVC_CIDR" || ip route add unreachable "$SVC_CIDR"
if [ -n "$uplink" ]; then
  for ipt in iptables ip6tables; do
    # Nothing forwarded (from a pod) leaves through the uplink.
    $ipt -C FORWARD -o "$uplink" -m comment --comment "$FENCE" -j DROP 2>/dev/null ||
      $ipt -I FORWARD 1 -o "$uplink" -m comment --comment "$FENCE" -j DROP
  done
  # Nothing from a pod address leaves through the uplink either.
  iptables -C OUTPUT -o "$uplink" -s "$CLUSTER_CIDR" -m comment --comment "$FENCE" -j DROP 2>/dev/null ||
    iptables -I OUTPUT 1 -o "$uplink" -s "$CLUSTER_CIDR" -m comment --comment "$FENCE" -j DROP
fi
log "fences: $NODE_LINK $NODE_IP, unreachable $SVC_CIDR, FORWARD/OUTPUT -o ${uplink:-none} DROP"

# --- CNI: a bridge of its own, no masquerading, pods routed to 10/8 only ---
cat >"$S/cni/net.d/10-servercount.conflist" <<J
{"cniVersion": "1.0.0", "name": "servercount-e2e", "plugins": [
 {"type": "bridge", "bridge": "$POD_BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
  "ipam": {"type": "host-local", "dataDir": "$S/cni/ipam", "ranges": [[{"subnet": "$POD_CIDR"}]],
           "routes": [{"dst": "10.0.0.0/8"}]}}]}
J

# --- containerd ---
cat >"$E/containerd.toml" <<T
version = 2
root = "$S/containerd/root"
state = "$S/containerd/state"
[grpc]
  address = "$S/containerd/containerd.sock"
[ttrpc]
  address = "$S/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  netns_mounts_under_state_dir = true
  # Root here lacks CAP_SYS_RESOURCE: runc cannot set the sandbox's
  # oom_score_adj of -998 and every sandbox fails without this.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/sbin/runc"
        Root = "$S/containerd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$S/cni/net.d"
T
# The image-pull fence: any pull (an image not loaded) goes to a closed
# local port and fails at once, on the machine; not even a registry's
# name is looked up.
start containerd env HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 \
  NO_PROXY="127.0.0.1,localhost,$NODE_IP,10.244.0.0/16,10.96.0.0/16" \
  containerd --config "$E/containerd.toml"
wait_for containerd 30 $CTR version
for img in "$S"/images/*.tar; do
  name=$(basename "$img" .tar)
  # The project's images are OCI archives with an index (make images);
  # keep the index under the exact name the overlay gives.
  $CTR images import --platform linux/amd64 --index-name "$IMAGE_REGISTRY/$name:$IMAGE_TAG" "$img" >/dev/null
done
log "images: $($CTR images ls -q | grep -v '^sha256:' | grep -v '@' | tr '\n' ' ')"

# --- etcd ---
start etcd etcd --name servercount-e2e --data-dir "$S/etcd" --listen-client-urls "http://$ETCD" \
  --advertise-client-urls "http://$ETCD" --listen-peer-urls "http://$ETCD_PEER" \
  --initial-advertise-peer-urls "http://$ETCD_PEER" --initial-cluster "servercount-e2e=http://$ETCD_PEER" \
  --listen-metrics-urls ""
wait_for etcd 30 curl -sf "http://$ETCD/health"

# --- kube-apiserver, with the manifests' egress selector from its start:
# the socket need not exist yet (a SIGTERM later takes it 60 s with live
# connections, so it is never restarted to add this) ---
sed "s#udsName: .*#udsName: $KN/uds/konnectivity-server.socket#" \
  "$PROJECT/examples/kubernetes/apiserver/egress-selector-configuration.yaml" >"$E/egress-selector-configuration.yaml"
start kube-apiserver "$BIN/kube-apiserver-$KUBE_VERSION" --bind-address="$NODE_IP" --advertise-address="$NODE_IP" \
  --secure-port="$API_PORT" --etcd-servers="http://$ETCD" --service-cluster-ip-range="$SVC_CIDR" \
  --client-ca-file="$P/ca.crt" --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" \
  --kubelet-client-certificate="$P/apiserver-kubelet-client.crt" --kubelet-client-key="$P/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority="$P/ca.crt" --kubelet-preferred-address-types=InternalIP \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local --service-account-key-file="$P/sa.pub" \
  --service-account-signing-key-file="$P/sa.key" --authorization-mode=Node,RBAC \
  --enable-admission-plugins=NodeRestriction --allow-privileged=true \
  --egress-selector-config-file="$E/egress-selector-configuration.yaml"
wait_for kube-apiserver 120 $KUBECTL get --raw /readyz

# --- kube-controller-manager (the EndpointSlice controller among them) and kube-scheduler ---
start kube-controller-manager "$BIN/kube-controller-manager-$KUBE_VERSION" \
  --kubeconfig="$E/controller-manager.kubeconfig" --authentication-kubeconfig="$E/controller-manager.kubeconfig" \
  --authorization-kubeconfig="$E/controller-manager.kubeconfig" --bind-address=127.0.0.1 --secure-port=30257 \
  --leader-elect=false --use-service-account-credentials=true --service-account-private-key-file="$P/sa.key" \
  --root-ca-file="$P/ca.crt" --flex-volume-plugin-dir="$S/kcm-volume-plugins" --allocate-node-cidrs=true \
  --cluster-cidr="$CLUSTER_CIDR" --node-cidr-mask-size=24 --service-cluster-ip-range="$SVC_CIDR"
start kube-scheduler "$BIN/kube-scheduler-$KUBE_VERSION" --kubeconfig="$E/scheduler.kubeconfig" \
  --authentication-kubeconfig="$E/scheduler.kubeconfig" --authorization-kubeconfig="$E/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=30259 --leader-elect=false

# --- the kubelet ---
cat >"$E/kubelet.yaml" <<Y
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $P/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $P/kubelet-serving.crt
tlsPrivateKeyFile: $P/kubelet-serving.key
containerRuntimeEndpoint: unix://$S/containerd/containerd.sock
# cgroup v1, no systemd, swap not off: 1.37 refuses each by default.
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
clusterDomain: cluster.local
# CoreDNS listens on the node address: without kube-proxy a Service IP
# goes nowhere.
clusterDNS: [$NODE_IP]
resolvConf: ""
podLogsDir: $S/kubelet-logs/pods
# No KUBE-* chains in the machine's iptables.
makeIPTablesUtilChains: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
maxPods: 30
serializeImagePulls: false
Y
start kubelet "$BIN/kubelet-$KUBE_VERSION" --config="$E/kubelet.yaml" --kubeconfig="$E/kubelet-client.kubeconfig" \
  --root-dir="$S/kubelet" --volume-plugin-dir="$S/kubelet-volume-plugins" --hostname-override="$NODE" --node-ip="$NODE_IP"

# --- CoreDNS on the node address: cluster.local only, nothing forwarded ---
cat >"$E/Corefile" <<C
.:53 {
    bind $NODE_IP
    errors
    health 127.0.0.1:30180
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $E/admin.kubeconfig local
        pods insecure
        ttl 5
    }
}
C
start coredns "$BIN/coredns-$COREDNS_VERSION" -conf "$E/Corefile"
wait_for coredns 30 curl -sf http://127.0.0.1:30180/health

wait_for "node $NODE" 120 $KUBECTL get node "$NODE"
wait_for "node $NODE Ready" 180 $KUBECTL wait --for=condition=Ready "node/$NODE" --timeout=1s
# The manifests put the servers on control-plane nodes; this node is one.
$KUBECTL label node "$NODE" node-role.kubernetes.io/control-plane= --overwrite >/dev/null
log "node up in $(($(date +%s) - t0))s"
