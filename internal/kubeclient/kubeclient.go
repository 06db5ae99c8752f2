// Package kubeclient builds the Kubernetes API client that the binaries use
// for TokenReviews and Leases, from the flags upstream has for it.
package kubeclient

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// DefaultContentType is upstream's --kube-api-content-type.
const DefaultContentType = "application/vnd.kubernetes.protobuf"

// Options are the client's flags.
type Options struct {
	// Kubeconfig is the file to reach the API server with; empty means the
	// in-cluster configuration (--kubeconfig).
	Kubeconfig string
	// ContentType is the encoding of requests (--kube-api-content-type).
	ContentType string
	// QPS and Burst limit the request rate; 0 keeps client-go's defaults
	// (--kubeconfig-qps, --kubeconfig-burst).
	QPS   float32
	Burst int
}

// New builds a client for o.
func New(o Options) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		if o.Kubeconfig == "" {
			return nil, fmt.Errorf("no in-cluster API server configuration (set --kubeconfig outside a pod): %w", err)
		}
		return nil, fmt.Errorf("read --kubeconfig %q: %w", o.Kubeconfig, err)
	}
	rc.ContentType = o.ContentType
	if o.QPS > 0 {
		rc.QPS = o.QPS
	}
	if o.Burst > 0 {
		rc.Burst = o.Burst
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("build the API server client: %w", err)
	}
	return client, nil
}
