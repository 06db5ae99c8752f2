// Package lease counts and publishes proxy-server Leases
// (coordination.k8s.io/v1), the way upstream Konnectivity does with
// --count-server-leases on agents and --enable-lease-controller on
// servers, so that our agents count the leases upstream servers publish
// and upstream agents count ours.
//
// A [Counter] watches the Leases of a namespace that match a label
// selector and counts the valid ones; it implements
// [servercounter.Counter] and [servercounter.Notifier], so an agent takes
// it as it takes a DNS count. A [Publisher] keeps a server's own Lease
// renewed and deletes the expired Leases of others.
//
// The package imports client-go; pkg/servercounter does not.
package lease
