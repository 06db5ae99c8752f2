package proctest

import "strconv"

// ServerFlags are the flags that place a proxy-server process, ours or
// upstream's (the two share these names): where it listens and with
// which certificates. Every test that starts one builds its flags here,
// so that a flag's name is spelled once.
type ServerFlags struct {
	// Mode is --mode: "grpc" or "http-connect".
	Mode string
	// ID is --server-id, left to the binary when empty.
	ID string
	// Host is the address the agent, health and (without a Socket)
	// frontend listeners bind; 127.0.0.1 when empty. The admin listener
	// binds AdminHost, or Host.
	Host, AdminHost string
	// Socket is --uds-name: the frontend listens on this Unix socket, and
	// on no port (--server-port=0: upstream's server refuses both).
	// Empty: it listens on FrontendPort, with TLS from Cert, Key and CA.
	Socket string
	// The ports of the frontend (without a Socket), agent, health and
	// admin listeners.
	FrontendPort, AgentPort, HealthPort, AdminPort int
	// Cert and Key are the server's certificate and key, for agents
	// (--cluster-cert, --cluster-key) and a TCP frontend (--server-cert,
	// --server-key). CA verifies a TCP frontend's clients and, unless
	// AgentsByToken, agents' certificates (--cluster-ca-cert).
	Cert, Key, CA string
	// AgentsByToken: agents authenticate with service-account tokens,
	// not client certificates (no --cluster-ca-cert).
	AgentsByToken bool
}

// Args returns the flags, then extra.
func (f ServerFlags) Args(extra ...string) []string {
	host := f.Host
	if host == "" {
		host = "127.0.0.1"
	}
	admin := f.AdminHost
	if admin == "" {
		admin = host
	}
	args := []string{"--mode=" + f.Mode}
	if f.ID != "" {
		args = append(args, "--server-id="+f.ID)
	}
	if f.Socket != "" {
		args = append(args, "--uds-name="+f.Socket, "--server-port=0")
	} else {
		args = append(args, "--server-bind-address="+host, "--server-port="+strconv.Itoa(f.FrontendPort),
			"--server-cert="+f.Cert, "--server-key="+f.Key, "--server-ca-cert="+f.CA)
	}
	args = append(args,
		"--agent-bind-address="+host, "--agent-port="+strconv.Itoa(f.AgentPort),
		"--health-bind-address="+host, "--health-port="+strconv.Itoa(f.HealthPort),
		"--admin-bind-address="+admin, "--admin-port="+strconv.Itoa(f.AdminPort),
		"--cluster-cert="+f.Cert, "--cluster-key="+f.Key)
	if !f.AgentsByToken {
		args = append(args, "--cluster-ca-cert="+f.CA)
	}
	return append(args, extra...)
}

// AgentFlags are the flags that place a proxy-agent process, ours or
// upstream's: the server it dials, its certificates and its listeners.
type AgentFlags struct {
	// ID is --agent-id, left to the binary when empty.
	ID string
	// ServerHost and ServerPort are the proxy-server's agent listener;
	// ServerHost is localhost when empty (the name in test certificates).
	ServerHost string
	ServerPort int
	// CA verifies the server; Cert and Key are the agent's own, none
	// when empty (an agent that authenticates with a token).
	CA, Cert, Key string
	// Host is the address the health and admin listeners bind; 127.0.0.1
	// when empty.
	Host                  string
	HealthPort, AdminPort int
}

// Args returns the flags, then extra.
func (f AgentFlags) Args(extra ...string) []string {
	server, host := f.ServerHost, f.Host
	if server == "" {
		server = "localhost"
	}
	if host == "" {
		host = "127.0.0.1"
	}
	var args []string
	if f.ID != "" {
		args = append(args, "--agent-id="+f.ID)
	}
	args = append(args,
		"--proxy-server-host="+server, "--proxy-server-port="+strconv.Itoa(f.ServerPort),
		"--ca-cert="+f.CA)
	if f.Cert != "" {
		args = append(args, "--agent-cert="+f.Cert, "--agent-key="+f.Key)
	}
	args = append(args,
		"--health-server-host="+host, "--health-server-port="+strconv.Itoa(f.HealthPort),
		"--admin-bind-address="+host, "--admin-server-port="+strconv.Itoa(f.AdminPort))
	return append(args, extra...)
}
