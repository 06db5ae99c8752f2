package tokenreview

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// claims are the claims of a JWT that the precheck reads.
type claims struct {
	Sub      string   `json:"sub"`
	Exp      *int64   `json:"exp"`
	Nbf      *int64   `json:"nbf"`
	Audience audience `json:"aud"`
}

// audience is a JWT's aud claim: a string or a list of them.
type audience []string

func (au *audience) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*au = audience{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("aud is neither a string nor a list of strings")
	}
	*au = many
	return nil
}

// precheck refuses, without a review, a token that the API server would
// surely refuse as the agents' service-account token for the audience: one
// that is not a signed JWT, whose subject is another account, that expired
// or is not yet valid (by more than clockSkew), or whose aud lacks the
// audience. Both bound tokens and legacy secret tokens carry sub, and
// bound tokens aud and exp; a token without aud is left to the review. It reads; it verifies no signature: the
// review does.
func (a *Authenticator) precheck(token string) error {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[2] == "" {
		return fmt.Errorf("%w: not a signed JWT (want three dot-separated parts)", errDenied)
	}
	var header struct {
		Alg string `json:"alg"`
	}
	if err := decodeSegment(parts[0], &header); err != nil {
		return fmt.Errorf("%w: JWT header: %w", errDenied, err)
	}
	if header.Alg == "" || strings.EqualFold(header.Alg, "none") {
		return fmt.Errorf("%w: JWT not signed (alg %q)", errDenied, header.Alg)
	}
	var c claims
	if err := decodeSegment(parts[1], &c); err != nil {
		return fmt.Errorf("%w: JWT claims: %w", errDenied, err)
	}
	now := a.cfg.Clock.Now()
	switch {
	case c.Sub != a.username:
		return fmt.Errorf("%w: agent token is for %q, not %s", errDenied, c.Sub, a.username)
	case c.Exp != nil && now.After(time.Unix(*c.Exp, 0).Add(clockSkew)):
		return fmt.Errorf("%w: agent token expired at %v", errDenied, time.Unix(*c.Exp, 0).UTC())
	case c.Nbf != nil && now.Add(clockSkew).Before(time.Unix(*c.Nbf, 0)):
		return fmt.Errorf("%w: agent token not valid before %v", errDenied, time.Unix(*c.Nbf, 0).UTC())
	case a.audience != "" && c.Audience != nil && !slices.Contains(c.Audience, a.audience):
		// Without aud (a legacy secret token) the API server decides:
		// such a token is for the API server's own audiences.
		return fmt.Errorf("%w: agent token not for audience %q (it is for %v): set the agents' token audience to %q", errDenied, a.audience, []string(c.Audience), a.audience)
	}
	return nil
}

// decodeSegment decodes one base64url segment of a JWT as JSON into v.
func decodeSegment(seg string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return fmt.Errorf("not base64url: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return nil
}

// expiry reads the exp claim of a JWT without checking it (the API server
// did): a cached acceptance must not outlive the token.
func expiry(token string) (time.Time, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *int64 `json:"exp"`
	}
	if json.Unmarshal(payload, &claims) != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	return time.Unix(*claims.Exp, 0), true
}
