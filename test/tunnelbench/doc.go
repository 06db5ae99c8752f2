// Package tunnelbench measures the speed of a tunnel through the built
// proxy-server and proxy-agent binaries, run as processes on loopback the
// way they run in a cluster: mTLS on the agent link, the frontend on a Unix
// socket, an HTTP target behind the agent.
//
// It holds only benchmarks (make bench-tunnel). Each figure is a ratio to
// a direct connection to the same target, measured in the same run and
// alternating with the tunnel, so that the machine's load and speed cancel
// out. It does not measure the binaries' memory or their behaviour under
// many tunnels at once: test/soak does.
package tunnelbench
