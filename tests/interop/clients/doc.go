// Package clients runs the Go konnectivity-client of every release the Go
// module proxy serves, v0.33.0 through v0.37.0, against our proxy-server and
// proxy-agent: the single-use tunnel kube-apiserver dials with today, and
// v0.37.0's ReusableTunnel (many Proxy streams on one gRPC connection).
//
// One Go build can hold one version of a module, so each client version is
// its own build of this package: go.mod pins v0.37.0 (the tests that need
// ReusableTunnel carry the build tag "reusable"), go.v0.3N.0.mod pins the
// older ones and is chosen with -modfile. run.sh runs every version; see
// ../README.md.
package clients
