// Package kubeclient builds the Kubernetes API clients that the binaries
// use for TokenReviews and Leases, from the flags upstream has for them.
//
// Each client knows only its own API group. client-go's clientset
// registers every group of the Kubernetes API when the program starts,
// which costs an idle proxy-agent about 10 MiB of its resident memory for
// the one group it uses.
package kubeclient

import (
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"
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

// Config builds the client configuration for o.
func Config(o Options) (*rest.Config, error) {
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
	return rc, nil
}

// Leases is a client for the Leases of one namespace. It has the methods
// of client-go's LeaseInterface that read and write whole objects.
type Leases = gentype.ClientWithList[*coordinationv1.Lease, *coordinationv1.LeaseList]

// NewLeases returns a client for the Leases in namespace.
func NewLeases(rc *rest.Config, namespace string) (*Leases, error) {
	c, params, err := restClient(rc, coordinationv1.SchemeGroupVersion, coordinationv1.AddToScheme)
	if err != nil {
		return nil, err
	}
	return gentype.NewClientWithList("leases", c, params, namespace,
		func() *coordinationv1.Lease { return &coordinationv1.Lease{} },
		func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} },
		gentype.PrefersProtobuf[*coordinationv1.Lease]()), nil
}

// Nodes is a client for Nodes, which are cluster-scoped.
type Nodes = gentype.ClientWithList[*corev1.Node, *corev1.NodeList]

// NewNodes returns a client for Nodes.
func NewNodes(rc *rest.Config) (*Nodes, error) {
	c, params, err := restClient(rc, corev1.SchemeGroupVersion, corev1.AddToScheme)
	if err != nil {
		return nil, err
	}
	return gentype.NewClientWithList("nodes", c, params, "",
		func() *corev1.Node { return &corev1.Node{} },
		func() *corev1.NodeList { return &corev1.NodeList{} },
		gentype.PrefersProtobuf[*corev1.Node]()), nil
}

// TokenReviews is a client for TokenReviews.
type TokenReviews = gentype.Client[*authenticationv1.TokenReview]

// NewTokenReviews returns a client for TokenReviews.
func NewTokenReviews(rc *rest.Config) (*TokenReviews, error) {
	c, params, err := restClient(rc, authenticationv1.SchemeGroupVersion, authenticationv1.AddToScheme)
	if err != nil {
		return nil, err
	}
	return gentype.NewClient("tokenreviews", c, params, "",
		func() *authenticationv1.TokenReview { return &authenticationv1.TokenReview{} },
		gentype.PrefersProtobuf[*authenticationv1.TokenReview]()), nil
}

// restClient returns a REST client for the API group version gv, with a
// scheme holding only the types addToScheme registers, and the codec for
// its query parameters.
func restClient(rc *rest.Config, gv schema.GroupVersion, addToScheme func(*runtime.Scheme) error) (*rest.RESTClient, runtime.ParameterCodec, error) {
	scheme := runtime.NewScheme()
	if err := addToScheme(scheme); err != nil {
		return nil, nil, fmt.Errorf("register %s: %w", gv, err)
	}
	// Options such as ListOptions are encoded as parameters of the
	// unversioned "v1", as client-go's own scheme registers them.
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	c := rest.CopyConfig(rc)
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	if gv.Group == "" {
		c.APIPath = "/api" // the core group
	}
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	client, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, nil, fmt.Errorf("build the API server client for %s: %w", gv, err)
	}
	return client, runtime.NewParameterCodec(scheme), nil
}
