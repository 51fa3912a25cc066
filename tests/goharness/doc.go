// Package goharness is what the Go programs of this repository share for
// driving proxies as child processes: the interop suite (tests/interop) and
// the benchmark harness (benches/go). It starts binaries and follows their
// output line by line, picks loopback ports for binaries that cannot bind
// port 0, polls readiness endpoints, and issues a throwaway PKI. Standard
// library only, so neither user pulls in the other's dependencies.
package goharness
