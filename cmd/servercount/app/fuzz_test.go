package app_test

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/servercount/servercount/cmd/servercount/app"
	"github.com/servercount/servercount/internal/fuzztest"
	"github.com/servercount/servercount/pkg/servercounter"
)

// FuzzProbeArgs parses every command line the fuzzer makes, as dig's
// grammar, and builds the counter it asks for (without querying). Nothing
// may panic, and every error is one line: the probe prints it after
// "servercount: ".
func FuzzProbeArgs(f *testing.F) {
	fuzztest.Add(f,
		"@10.96.0.10 proxy.kube-system.svc.cluster.local",
		"_agent._tcp.proxy.kube-system.svc.cluster.local srv --short",
		"@[::1]:5353 -t aaaa x.example --timeout 2s --attempts 2 --tcp",
		"--watch --interval 1s --json x.example ip",
		"@ x.example", "a b c", "--attempts=-1 x", "x.example mx", "@1.2.3.4:99999 x",
		"a..b", "--type srv x y",
	)
	resolvConf := filepath.Join(f.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolvConf, nil, 0o644); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, line string) {
		o := app.NewOptions()
		oneLine := func(err error) {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error of %q spans lines: %q", line, err)
			}
		}
		if err := o.Parse(strings.Fields(line), io.Discard); err != nil {
			oneLine(err)
			return
		}
		if errs := o.Validate(); len(errs) > 0 {
			for _, err := range errs {
				oneLine(err)
			}
			return
		}
		// Never read a file the fuzzer names: /dev/stdin would block.
		o.ResolvConf = resolvConf
		if _, err := servercounter.NewDNSServerCounter(o.Config()); err != nil {
			// Config errors are joined, one per line, by design; each
			// must still be one line.
			for _, e := range strings.Split(err.Error(), "\n") {
				if strings.TrimSpace(e) == "" {
					t.Fatalf("empty line in the error of %q: %q", line, err)
				}
			}
		}
	})
}
