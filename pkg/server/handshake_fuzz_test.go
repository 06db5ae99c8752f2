package server

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/servercount/servercount/pkg/wire"
)

// FuzzHandshake feeds the server whatever agentID, agentIdentifiers and
// authorization metadata an unauthenticated peer could send. It must not
// panic; a refused token learns only "authentication failed" (or that its
// address must wait), and no answer echoes more than a capped copy of
// what the peer sent.
func FuzzHandshake(f *testing.F) {
	for _, seed := range []struct{ id, idents, auth string }{
		{"agent-1", "host=node-1&default-route=true", "Bearer good"},
		{"", "", "Bearer good"},
		{"agent-1", "ipv4=not-an-ip", "Bearer good"},
		{"agent-1", "%zz", "Bearer good"},
		{"agent-1", "", "Basic good"},
		{"agent-1", "", "Bearer bad"},
	} {
		f.Add(seed.id, seed.idents, seed.auth)
	}
	tokens := filepath.Join(f.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("good\n"), 0o600); err != nil {
		f.Fatal(err)
	}
	auth, err := NewTokenFileAuthenticator(tokens)
	if err != nil {
		f.Fatal(err)
	}
	s, err := New(Config{ServerID: "s1", Authenticator: auth})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(s.Close)
	f.Fuzz(func(t *testing.T, id, idents, authz string) {
		md := metadata.Pairs(wire.HeaderAgentID, id, wire.HeaderAgentIdentifiers, idents, wire.HeaderAuthorization, authz)
		ctx := metadata.NewIncomingContext(context.Background(), md)
		// Spellings other than "Bearer good" may be the same token
		// ("bearer good"): the authenticator says which are.
		_, authErr := s.admission.authenticate(ctx, md)
		tokenOK := authErr == nil
		gotID, _, err := s.admission.handshake(ctx)
		if err == nil {
			if !tokenOK || gotID != id || id == "" {
				t.Fatalf("accepted agent %q with authorization %q as %q", id, authz, gotID)
			}
			return
		}
		msg := status.Convert(err).Message()
		// A refused token is told that, or that its address may not
		// try again yet: nothing of why.
		if !tokenOK && msg != errTextUnauthenticated && msg != errTooManyRefused.Error() && msg != errTooManyHandshakes.Error() {
			t.Fatalf("a refused token was told %q", msg)
		}
		if len(msg) > maxLoggedPeerBytes+32 {
			t.Fatalf("answer of %d bytes echoes the peer unbounded", len(msg))
		}
	})
}
