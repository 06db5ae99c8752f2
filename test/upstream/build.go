package upstream

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Environment variables that point at upstream's binaries or source.
const (
	// EnvBin names a directory that holds upstream's server, agent,
	// test-client and test-server, built already.
	EnvBin = "SERVERCOUNT_UPSTREAM_BIN"
	// EnvSource names upstream's source: the archive
	// apiserver-network-proxy-<commit>.tar.xz, or a source tree with its
	// vendor directory.
	EnvSource = "SERVERCOUNT_UPSTREAM_SRC"
)

// Binaries are upstream's programs, built from one source.
type Binaries struct {
	// Server, Agent, TestClient and TestServer are the executables.
	Server, Agent, TestClient, TestServer string
	// Source is the source tree they were built from; empty when they
	// came from EnvBin.
	Source string
	// Commit names the source: the archive's commit, or "local".
	Commit string
}

// ErrUnavailable is wrapped by Find's error when there is neither a
// binary nor a source to build from.
var ErrUnavailable = errors.New("upstream's binaries are not available")

// archiveName matches the archive of ../shared/upstream.
var archiveName = regexp.MustCompile(`^apiserver-network-proxy-([0-9a-f]{7,40})\.tar\.xz$`)

// buildTimeout bounds one build of upstream: 1-4 minutes on 2 cores.
const buildTimeout = 15 * time.Minute

// Find returns upstream's binaries: those in $SERVERCOUNT_UPSTREAM_BIN,
// or those built from $SERVERCOUNT_UPSTREAM_SRC, or from the archive in
// shared/upstream beside the module's checkout. Builds are cached under
// the user's cache directory (~/.cache/servercount-upstream/<commit>), so
// that only the first run builds. The error wraps ErrUnavailable, and
// says how to get them, when there is nothing to use.
func Find(ctx context.Context, moduleRoot string) (Binaries, error) {
	if dir := os.Getenv(EnvBin); dir != "" {
		b := binariesIn(dir)
		for _, f := range []string{b.Server, b.Agent, b.TestClient, b.TestServer} {
			if _, err := os.Stat(f); err != nil {
				return Binaries{}, fmt.Errorf("%s=%s: %w", EnvBin, dir, err)
			}
		}
		b.Commit = "local"
		return b, nil
	}
	src := os.Getenv(EnvSource)
	if src == "" {
		matches, _ := filepath.Glob(filepath.Join(moduleRoot, "..", "shared", "upstream", "apiserver-network-proxy-*.tar.xz"))
		if len(matches) == 0 {
			return Binaries{}, fmt.Errorf("%w: put upstream's source archive in ../shared/upstream, or set %s to its archive or source tree, or %s to a directory of its built server, agent, test-client and test-server", ErrUnavailable, EnvSource, EnvBin)
		}
		src = matches[len(matches)-1]
	}
	return build(ctx, src)
}

// Require is Find for a test: it fails tb, with one line saying how to
// get them, when upstream's binaries are not available or a build
// fails.
func Require(tb testing.TB) Binaries {
	tb.Helper()
	root, err := moduleRoot()
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	b, err := Find(ctx, root)
	if err != nil {
		// Every caller is a suite or benchmark that was asked for by
		// name: one that found nothing to compare with must not pass.
		tb.Fatal(err)
	}
	return b
}

func binariesIn(dir string) Binaries {
	return Binaries{
		Server: filepath.Join(dir, "server"), Agent: filepath.Join(dir, "agent"),
		TestClient: filepath.Join(dir, "test-client"), TestServer: filepath.Join(dir, "test-server"),
	}
}

// build builds the binaries from src, an archive or a tree, into the
// cache, unless they are there already.
func build(ctx context.Context, src string) (Binaries, error) {
	st, err := os.Stat(src)
	if err != nil {
		return Binaries{}, fmt.Errorf("upstream source: %w", err)
	}
	commit := "local-" + shortHash(src)
	if m := archiveName.FindStringSubmatch(filepath.Base(src)); m != nil && !st.IsDir() {
		commit = m[1]
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return Binaries{}, fmt.Errorf("upstream: no cache directory: %w", err)
	}
	dir := filepath.Join(cache, "servercount-upstream", commit)
	b := binariesIn(filepath.Join(dir, "bin"))
	b.Commit, b.Source = commit, filepath.Join(dir, "src", "apiserver-network-proxy")
	if st.IsDir() {
		b.Source = src
	}
	// A tree may change: it is built again each time (go's build cache
	// makes that quick); an archive is built once.
	if _, err := os.Stat(b.TestServer); err == nil && !st.IsDir() {
		return b, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return Binaries{}, err
	}
	// Built beside, then renamed into place: a second build running at
	// the same time finds it there, or loses the rename and uses the
	// first one's.
	tmp, err := os.MkdirTemp(filepath.Dir(dir), commit+".tmp-")
	if err != nil {
		return Binaries{}, err
	}
	defer os.RemoveAll(tmp)
	tree := src
	if !st.IsDir() {
		if err := os.MkdirAll(filepath.Join(tmp, "src"), 0o755); err != nil {
			return Binaries{}, err
		}
		if out, err := exec.CommandContext(ctx, "tar", "-C", filepath.Join(tmp, "src"), "-xJf", src).CombinedOutput(); err != nil {
			return Binaries{}, fmt.Errorf("upstream: unpack %s: %w\n%s", src, err, out)
		}
		tree = filepath.Join(tmp, "src", "apiserver-network-proxy")
	}
	fmt.Fprintf(os.Stderr, "upstream: building server, agent, test-client and test-server from %s (once; 1-4 minutes)\n", src)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(tmp, "bin")+string(os.PathSeparator),
		"./cmd/server", "./cmd/agent", "./cmd/test-client", "./cmd/test-server")
	cmd.Dir = tree
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=vendor", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("upstream: build in %s: %w\n%s", tree, err, out)
	}
	if st.IsDir() {
		_ = os.RemoveAll(filepath.Join(dir, "bin"))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return Binaries{}, err
		}
		if err := os.Rename(filepath.Join(tmp, "bin"), filepath.Join(dir, "bin")); err != nil {
			return Binaries{}, err
		}
		return b, nil
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(b.TestServer); serr == nil {
			return b, nil // another build got there first
		}
		return Binaries{}, fmt.Errorf("upstream: put the build in place: %w", err)
	}
	return b, nil
}

func shortHash(s string) string {
	abs, err := filepath.Abs(s)
	if err == nil {
		s = abs
	}
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:4])
}

// moduleRoot finds the directory of this module's go.mod above the
// working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module github.com/servercount/servercount\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("upstream: no go.mod of github.com/servercount/servercount above the working directory")
		}
		dir = parent
	}
}
