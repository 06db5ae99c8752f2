# Sourced by the cluster-e2e scripts: the node's names, addresses and
# paths, in one place. S is the state directory (fixed: the overlay's
# hostPath volumes name it): everything the node
# writes goes under it, but for what down.sh removes by name.
S=/tmp/servercount-cluster-e2e/node
KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
COREDNS_VERSION=${COREDNS_VERSION:-v1.15.0}
CACHE=${SERVERCOUNT_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servercount-e2e}
BIN=$CACHE/bin
NODE=servercount-node
# The node's address sits on a bridge with no ports (there is no dummy
# link driver here): reachable from the host and the pods, routed nowhere.
NODE_IP=10.250.0.1
NODE_LINK=sce2e0
POD_BRIDGE=sce2ebr0
POD_CIDR=10.244.0.0/24
CLUSTER_CIDR=10.244.0.0/16
# No kube-proxy: the service CIDR is an unreachable route, so a packet to
# a Service IP fails at once on the node instead of leaving it.
SVC_CIDR=10.96.0.0/16
ETCD=127.0.0.1:32379
ETCD_PEER=127.0.0.1:32380
API_PORT=36443
# The comment on every iptables rule the scripts add, so that down.sh and
# the end-of-run check find exactly those.
FENCE=servercount-cluster-e2e-fence
P=$S/pki
E=$S/etc
L=$S/logs
PIDS=$S/pids
KN=$S/konn
# Images as the kubelet sees them (the overlay uses the same names).
IMAGE_REGISTRY=servercount.local
IMAGE_TAG=e2e
PAUSE_IMAGE=$IMAGE_REGISTRY/pause:e2e
KUBECTL="$BIN/kubectl-$KUBE_VERSION --kubeconfig $E/admin.kubeconfig --cache-dir $S/kube-cache"
CTR="ctr -a $S/containerd/containerd.sock -n k8s.io"
