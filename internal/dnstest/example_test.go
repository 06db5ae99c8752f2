package dnstest_test

import (
	"fmt"
	"log"

	"github.com/miekg/dns"

	"github.com/servercount/servercount/internal/dnstest"
)

// This example serves the records of a headless Kubernetes Service and asks
// for its SRV records, once normally and once while the server fails.
func Example() {
	s, err := dnstest.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	const svc = "proxy.kube-system.svc.cluster.local."
	s.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, "10.0.0.1", "10.0.0.2")...)

	m := new(dns.Msg)
	m.SetQuestion("_agent._tcp."+svc, dns.TypeSRV)
	c := new(dns.Client)

	r, _, err := c.Exchange(m, s.Addr())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(dns.RcodeToString[r.Rcode], len(r.Answer), "SRV records,", len(r.Extra), "glue records")

	s.SetFault(dnstest.Fault{Kind: dnstest.FaultServFail, Count: 1})
	r, _, err = c.Exchange(m, s.Addr())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(dns.RcodeToString[r.Rcode], len(r.Answer), "SRV records")
	// Output:
	// NOERROR 2 SRV records, 2 glue records
	// SERVFAIL 0 SRV records
}

func ExampleServer_SetZone() {
	s, err := dnstest.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	err = s.SetZone(`
$ORIGIN example.
www   A     192.0.2.1
web   CNAME www
`)
	if err != nil {
		log.Fatal(err)
	}

	m := new(dns.Msg)
	m.SetQuestion("web.example.", dns.TypeA)
	r, _, err := new(dns.Client).Exchange(m, s.Addr())
	if err != nil {
		log.Fatal(err)
	}
	for _, rr := range r.Answer {
		fmt.Println(rr.Header().Name, dns.TypeToString[rr.Header().Rrtype])
	}
	// Output:
	// web.example. CNAME
	// www.example. A
}
