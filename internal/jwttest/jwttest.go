// Package jwttest makes tokens shaped as Kubernetes service-account JWTs
// for tests: their claims pass the proxy-server's precheck, and their
// signature is a name that a test's TokenReview endpoint knows them by.
// Only that endpoint says whether one is valid; nothing here signs.
package jwttest

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"time"
)

// Claims are what a token claims.
type Claims struct {
	// Subject is the sub claim, "system:serviceaccount:<ns>:<name>".
	Subject string `json:"sub"`
	// Audience is the aud claim; empty leaves it out.
	Audience []string `json:"aud,omitempty"`
	// Expiry is the exp claim in Unix seconds; 0 leaves it out.
	Expiry int64 `json:"exp,omitempty"`
}

// header is an RS256 JWT header, as the API server's tokens have.
var header = base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"RS256"}`))

// Token returns a token with claims c whose signature is name.
func Token(c Claims, name string) string {
	payload, err := json.Marshal(c)
	if err != nil {
		panic(err) // Claims always marshal
	}
	return header + "." + base64.RawURLEncoding.EncodeToString(payload) + "." + base64.RawURLEncoding.EncodeToString([]byte(name))
}

// ServiceAccount returns the sub claim of a service account's tokens.
func ServiceAccount(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

// Expires returns t as an exp claim.
func Expires(t time.Time) int64 { return t.Unix() }

// Name returns the name Token gave token, or token itself when it is not
// one of Token's.
func Name(token string) string {
	parts := strings.Split(token, ".")
	if len(parts) == 3 {
		if b, err := base64.RawURLEncoding.DecodeString(parts[2]); err == nil {
			return string(b)
		}
	}
	return token
}
