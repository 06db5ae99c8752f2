package harness

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// CreateNamespace creates namespace name.
func CreateNamespace(ctx context.Context, client kubernetes.Interface, name string) error {
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	return nil
}

// Endpoint is one address of a Service's EndpointSlice.
type Endpoint struct {
	// IP is an IPv4 address where a proxy-server listens.
	IP string
	// Ready is the endpoint's ready condition, as the EndpointSlice
	// controller writes it: a pod's readiness, or true for every pod when
	// the Service has publishNotReadyAddresses.
	Ready bool
}

// Service is a selector-less headless Service whose single EndpointSlice
// the test writes itself, in place of the EndpointSlice controller.
type Service struct {
	// Namespace and Name name the Service.
	Namespace, Name string
	// Ports are the Service's named TCP ports, which the EndpointSlice
	// repeats.
	Ports map[string]int32

	client kubernetes.Interface

	mu        sync.Mutex // guards endpoints; held across the API call so updates are ordered
	endpoints []Endpoint
}

// ServiceConfig configures CreateHeadlessService.
type ServiceConfig struct {
	// Namespace and Name name the Service.
	Namespace, Name string
	// Ports are named TCP ports, e.g. {"agent": 8091, "frontend": 8090}.
	Ports map[string]int32
	// PublishNotReadyAddresses sets the field of that name.
	PublishNotReadyAddresses bool
}

// CreateHeadlessService creates a headless Service without a selector (no
// controller manages its endpoints) and an empty EndpointSlice for it.
func CreateHeadlessService(ctx context.Context, client kubernetes.Interface, cfg ServiceConfig) (*Service, error) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: cfg.Name, Namespace: cfg.Namespace},
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			PublishNotReadyAddresses: cfg.PublishNotReadyAddresses,
		},
	}
	for _, name := range sortedKeys(cfg.Ports) {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: name, Protocol: corev1.ProtocolTCP, Port: cfg.Ports[name]})
	}
	if _, err := client.CoreV1().Services(cfg.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create Service %s/%s: %w", cfg.Namespace, cfg.Name, err)
	}
	s := &Service{Namespace: cfg.Namespace, Name: cfg.Name, Ports: cfg.Ports, client: client}
	return s, s.SetEndpoints(ctx)
}

// FQDN is the Service's absolute DNS name.
func (s *Service) FQDN() string {
	return fmt.Sprintf("%s.%s.svc.%s.", s.Name, s.Namespace, ClusterDomain)
}

// SRVName is the absolute SRV name of the named TCP port.
func (s *Service) SRVName(port string) string { return "_" + port + "._tcp." + s.FQDN() }

// sliceName is the name of the one EndpointSlice the test manages.
func (s *Service) sliceName() string { return s.Name + "-e2e" }

// Endpoints returns the endpoints last written.
func (s *Service) Endpoints() []Endpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Endpoint(nil), s.endpoints...)
}

// SetEndpoints replaces the endpoints of the Service's EndpointSlice.
func (s *Service) SetEndpoints(ctx context.Context, eps ...Endpoint) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.sliceName(), Namespace: s.Namespace,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: s.Name,
				discoveryv1.LabelManagedBy:   "servercount-e2e",
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{},
	}
	for _, name := range sortedKeys(s.Ports) {
		slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: ptr(name), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(s.Ports[name])})
	}
	for _, ep := range eps {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{ep.IP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(ep.Ready), Serving: ptr(ep.Ready), Terminating: ptr(false)},
		})
	}
	api := s.client.DiscoveryV1().EndpointSlices(s.Namespace)
	cur, err := api.Get(ctx, slice.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = api.Create(ctx, slice, metav1.CreateOptions{})
	case err == nil:
		slice.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(ctx, slice, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("write EndpointSlice %s/%s with %s: %w", s.Namespace, slice.Name, describe(eps), err)
	}
	s.endpoints = append([]Endpoint(nil), eps...)
	return nil
}

// Ready returns endpoints for ips, all ready.
func Ready(ips ...string) []Endpoint {
	eps := make([]Endpoint, 0, len(ips))
	for _, ip := range ips {
		eps = append(eps, Endpoint{IP: ip, Ready: true})
	}
	return eps
}

func describe(eps []Endpoint) string {
	var parts []string
	for _, ep := range eps {
		parts = append(parts, fmt.Sprintf("%s(ready=%t)", ep.IP, ep.Ready))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func ptr[T any](v T) *T { return &v }
