package server

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"strings"
)

// ErrTokenRefused marks an error of a [TokenAuthenticator] that is a
// verdict against the token, as opposed to a failure to judge it (an API
// server that does not answer): authenticators wrap their refusals with
// it. An address whose tokens are refused too often is refused without a
// check for a while (see admit).
var ErrTokenRefused = errors.New("token refused")

// errUnknownToken is returned for a token that is not in the file.
var errUnknownToken = fmt.Errorf("%w: not recognised", ErrTokenRefused)

// tokenFile accepts a fixed set of tokens. It keeps their SHA-256 digests
// and compares digests in constant time, so neither the tokens' lengths
// nor their prefixes leak through timing.
type tokenFile struct {
	path    string
	digests [][sha256.Size]byte // read-only after construction
}

// NewTokenFileAuthenticator returns an authenticator that accepts the
// tokens listed in the file at path, one per line. Surrounding spaces,
// blank lines and lines starting with # are ignored. The file is read
// once; a file with no token is an error.
func NewTokenFileAuthenticator(path string) (TokenAuthenticator, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read agent token file: %w", err)
	}
	defer f.Close()
	a := &tokenFile{path: path}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		a.digests = append(a.digests, sha256.Sum256([]byte(line)))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read agent token file %s: %w", path, err)
	}
	if len(a.digests) == 0 {
		return nil, fmt.Errorf("agent token file %s holds no token: write one token per line", path)
	}
	return a, nil
}

// AuthenticateToken implements [TokenAuthenticator].
func (a *tokenFile) AuthenticateToken(_ context.Context, token string) error {
	if token == "" {
		return errors.New("empty token")
	}
	d := sha256.Sum256([]byte(token))
	ok := 0
	for i := range a.digests {
		ok |= subtle.ConstantTimeCompare(d[:], a.digests[i][:])
	}
	if ok != 1 {
		return fmt.Errorf("%w (not listed in %s)", errUnknownToken, a.path)
	}
	return nil
}
