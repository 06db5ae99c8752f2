module github.com/servercount/servercount

go 1.26

require (
	github.com/cenkalti/backoff/v4 v4.3.0
	github.com/miekg/dns v1.1.73
	github.com/spf13/pflag v1.0.10
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
	k8s.io/klog/v2 v2.140.0
)

require (
	github.com/go-logr/logr v1.4.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.57.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
)
