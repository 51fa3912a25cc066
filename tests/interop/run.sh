#!/usr/bin/env bash
# Interop suite: our proxy-server / proxy-agent against upstream
# apiserver-network-proxy v0.36.0 (built here from the Go module proxy) and
# the Go konnectivity-client, every pairing. See README.md.
#
# Environment (all optional):
#   INTEROP_RUST_BIN_DIR      prebuilt proxy-server and proxy-agent (skips cargo build)
#   INTEROP_UPSTREAM_BIN_DIR  prebuilt upstream-proxy-server and upstream-proxy-agent
#   INTEROP_CACHE_DIR         where upstream binaries are built (default tests/interop/bin)
#   INTEROP_LOG_DIR           write each child process's full log there when it stops
#   INTEROP_GO_TEST_FLAGS     extra `go test` flags for the main suite, e.g. "-run TestInterop/pairs/server=ours"
#   K8S_BIN_DIR               etcd, kube-apiserver and kubectl for the lease
#                             scenarios (default tests/k8s/bin, built there by
#                             tests/k8s/build.sh when missing)
#   INTEROP_VERSIONS          older upstream releases for TestVersions (default "v0.33.0 v0.34.0")
#   INTEROP_CLIENTS=0         skip the konnectivity-client versions (clients/)
#   INTEROP_HEAVY=1           clients/: 300 x 4 MiB on one ReusableTunnel instead of 300 x 256 KiB
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

min_go="1.26.2"
if ! command -v go >/dev/null 2>&1; then
  cat >&2 <<MSG
error: the interop suite needs Go $min_go or newer, and 'go' is not on PATH.
Install Go (https://go.dev/doc/install: unpack the release tarball into /usr/local
and add /usr/local/go/bin to PATH), then run this script again. It fetches
sigs.k8s.io/apiserver-network-proxy v0.36.0 through the Go module proxy.
MSG
  exit 1
fi
have_go="$(go env GOVERSION)"   # e.g. go1.26.8
have_go="${have_go#go}"
if [ "$(printf '%s\n%s\n' "$min_go" "${have_go%%[-+ ]*}" | sort -V | head -n1)" != "$min_go" ]; then
  echo "error: the interop suite needs Go $min_go or newer (upstream v0.36.0's go.mod); found go$have_go. Install a newer Go: https://go.dev/doc/install" >&2
  exit 1
fi

if [ -z "${INTEROP_RUST_BIN_DIR:-}" ]; then
  echo "==> cargo build --bins -p proxy-server -p proxy-agent" >&2
  (cd "$root" && cargo build --bins -p proxy-server -p proxy-agent)
  export INTEROP_RUST_BIN_DIR="$root/target/debug"
fi

export K8S_BIN_DIR="${K8S_BIN_DIR:-$root/tests/k8s/bin}"
for b in etcd kube-apiserver kubectl; do
  if [ ! -x "$K8S_BIN_DIR/$b" ]; then
    echo "==> tests/k8s/build.sh ($b missing in $K8S_BIN_DIR)" >&2
    "$root/tests/k8s/build.sh"
    break
  fi
done

cd "$here"
echo "==> go test (interop, $(go env GOVERSION))" >&2
# -parallel: the environments (one server and its agents each) mostly wait
# on sockets and timers, so they run together even on 2 cores.
# shellcheck disable=SC2086
go test -count=1 -timeout 14m -parallel 16 -v ${INTEROP_GO_TEST_FLAGS:-} .

# konnectivity-client v0.33.0 … v0.36.0 (single-use tunnel) and v0.37.0
# (single-use and ReusableTunnel) against our server: one build per version
# of clients/ (go.v*.mod picks the version; go.mod is v0.37.0).
if [ "${INTEROP_CLIENTS:-1}" != 0 ]; then
  for v in v0.33.0 v0.34.0 v0.35.0 v0.36.0; do
    echo "==> go test (clients/, konnectivity-client $v)" >&2
    GOFLAGS="${GOFLAGS:-} -modfile=go.$v.mod" go test -C clients -count=1 -timeout 10m -v .
  done
  echo "==> go test (clients/, konnectivity-client v0.37.0, ReusableTunnel too)" >&2
  go test -C clients -tags reusable -count=1 -timeout 20m -v .
fi
