package server

// QueueSize is queueSize, for the tests of package server_test that
// check a queue's bound in bytes.
const QueueSize = queueSize

// MaxControl is maxControl, for the test of the control queue's bound.
const MaxControl = maxControl
