package kubeclient

import (
	"fmt"
	"os"
)

// WriteKubeconfig writes a kubeconfig to path for the API server at
// serverURL, presenting token and trusting any certificate: for tests,
// the demo and tools that reach an API server of their own making.
func WriteKubeconfig(path, serverURL, token string) error {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: %q}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, serverURL, token)
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}
