// Package interop runs the Rust proxy-server and proxy-agent against the
// upstream Go apiserver-network-proxy v0.36.0 binaries and the Go
// konnectivity-client, in every pairing. The tests live in *_test.go; see
// README.md for how to run them.
package interop
