package serve_test

import (
	"crypto/tls"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/serve"
)

func TestParseTLSPolicy(t *testing.T) {
	ids, err := serve.ParseCipherSuites("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384")
	require.NoError(t, err)
	assert.Equal(t, []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384}, ids)
	ids, err = serve.ParseCipherSuites("[]")
	require.NoError(t, err)
	assert.Nil(t, ids, "pflag's printing of an empty list means the defaults")
	_, err = serve.ParseCipherSuites("TLS_RSA_WITH_RC5")
	assert.ErrorContains(t, err, `unknown cipher suite "TLS_RSA_WITH_RC5"`)

	v, err := serve.ParseTLSVersion("VersionTLS13")
	require.NoError(t, err)
	assert.Equal(t, uint16(tls.VersionTLS13), v)
	_, err = serve.ParseTLSVersion("TLS1.3")
	assert.ErrorContains(t, err, `unknown TLS version "TLS1.3"`)

	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	serve.TLSPolicy{CipherSuites: ids, MinVersion: tls.VersionTLS13}.Apply(cfg)
	assert.Equal(t, uint16(tls.VersionTLS13), cfg.MinVersion)
}
