// Package nodes keeps the names and addresses of the cluster's Nodes,
// from a watch of the API server: with --bind-agent-identifiers, an agent
// whose token is bound to a node may claim that node's names and
// addresses, and no others.
//
// Only the addresses of each Node are kept: a Node object is tens of KiB
// (images, conditions, capacity), and a cluster has thousands.
package nodes

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/servercount/servercount/internal/kubeclient"
)

// Addresses is the Nodes' names and addresses, kept up to date by Run. It
// implements tokenreview.Nodes.
type Addresses struct {
	informer cache.SharedIndexInformer
}

// Watch returns the Addresses of the cluster rc reaches; they are empty
// until Run has listed the Nodes (see Synced). The client needs get, list
// and watch on nodes.
func Watch(rc *rest.Config) (*Addresses, error) {
	client, err := kubeclient.NewNodes(rc)
	if err != nil {
		return nil, err
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return client.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return client.Watch(ctx, opts)
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &corev1.Node{}, 0, cache.Indexers{})
	if err := inf.SetTransform(addressesOnly); err != nil {
		return nil, fmt.Errorf("watch nodes: %w", err)
	}
	return &Addresses{informer: inf}, nil
}

// addressesOnly keeps of a Node its name, version and addresses.
func addressesOnly(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil // a deletion's tombstone
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, ResourceVersion: n.ResourceVersion},
		Status:     corev1.NodeStatus{Addresses: n.Status.Addresses},
	}, nil
}

// Run watches the Nodes until ctx is done.
func (a *Addresses) Run(ctx context.Context) { a.informer.RunWithContext(ctx) }

// Synced waits until Run has listed the Nodes once, or ctx is done, and
// reports whether it has.
func (a *Addresses) Synced(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), a.informer.HasSynced)
}

// Node returns the host names (Hostname, InternalDNS and ExternalDNS
// addresses) and the IP addresses of the node called name; ok is false
// when no such Node is known.
func (a *Addresses) Node(name string) (hosts []string, addrs []netip.Addr, ok bool) {
	obj, exists, err := a.informer.GetStore().GetByKey(name)
	if err != nil || !exists {
		return nil, nil, false
	}
	n, isNode := obj.(*corev1.Node)
	if !isNode {
		return nil, nil, false
	}
	for _, na := range n.Status.Addresses {
		switch na.Type {
		case corev1.NodeInternalIP, corev1.NodeExternalIP:
			if ip, err := netip.ParseAddr(na.Address); err == nil {
				addrs = append(addrs, ip.Unmap())
			}
		case corev1.NodeHostName, corev1.NodeInternalDNS, corev1.NodeExternalDNS:
			hosts = append(hosts, na.Address)
		}
	}
	return hosts, addrs, true
}
