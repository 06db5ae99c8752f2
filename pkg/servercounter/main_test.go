package servercounter_test

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/miekg/dns"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/dnstest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(closingM{m})
}

// closingM runs the tests, then closes the server they shared, so that
// goleak.VerifyTestMain, which looks for leaks once Run returns, does not
// take that server's goroutines for leaks, and still finds any the server
// leaves behind when it closes.
type closingM struct{ m *testing.M }

func (c closingM) Run() int {
	code := c.m.Run()
	if err := headless3Shared.close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return code
}

// headless3Records returns the records of headless3, parsed once for the
// whole test binary: under the race detector, parsing it cost as much as
// starting a server, and some twenty tests serve it in every run.
var headless3Records = sync.OnceValues(func() ([]dns.RR, error) { return dnstest.ParseZone(headless3) })

// newHeadless3Server starts a server of headless3 for a test of its own,
// one that sets a fault, changes the records or counts queries.
func newHeadless3Server(t *testing.T) *dnstest.Server {
	t.Helper()
	rrs, err := headless3Records()
	if err != nil {
		t.Fatal(err)
	}
	srv := dnstest.NewServer(t)
	srv.SetRecords(rrs...)
	return srv
}

// headless3Shared is one server of headless3 for every test that only
// reads it, started by the first such test and closed by TestMain: a
// server per test was a good part of this package's test time. Tests get
// its address only, so none can set a fault or change a record under
// another; and none of them counts its queries, which other tests share.
var headless3Shared sharedServer

// sharedServer is a dnstest server of headless3 that tests share.
type sharedServer struct {
	once sync.Once
	srv  *dnstest.Server // set once, by once
	err  error           // set once, by once
}

// addr returns the address of the shared server, starting it on first use.
func (s *sharedServer) addr(t *testing.T) string {
	t.Helper()
	s.once.Do(func() {
		var rrs []dns.RR
		if rrs, s.err = headless3Records(); s.err != nil {
			return
		}
		if s.srv, s.err = dnstest.Start(); s.err != nil {
			return
		}
		s.srv.SetRecords(rrs...)
	})
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s.srv.Addr()
}

// close stops the server if a test started it. Call it once every test has
// returned.
func (s *sharedServer) close() error {
	// Do, even of nothing: no test can start the server after close, and
	// what a test's Do wrote is visible here.
	s.once.Do(func() {})
	if s.srv == nil {
		return nil
	}
	return s.srv.Close()
}
