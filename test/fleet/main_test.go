package fleet

import (
	"io"
	"testing"

	"go.uber.org/goleak"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

func TestMain(m *testing.M) {
	// A thousand agents each log when a server goes away: the figures
	// would drown in it.
	klog.SetLogger(textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(io.Discard))))
	goleak.VerifyTestMain(m,
		// client-go's HTTP transport keeps idle connections to the
		// TokenReview endpoint; their loops end once the endpoint has
		// closed them, which can be just after the test.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}
