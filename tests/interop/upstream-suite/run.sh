#!/usr/bin/env bash
# Runs upstream's own test suite (the tests/ package of
# sigs.k8s.io/apiserver-network-proxy v0.36.0, fetched by the Go module
# proxy) against our proxy-agent and proxy-server, RUNS times per pairing.
# See ../README.md ("Upstream's own suite").
#
# Upstream's suite runs an external agent itself (-agent-path); for an
# external server it has no runner, so testdata/zz_external_server_test.go
# (ours) is added to its package with `go test -overlay`. Go refuses
# overlays inside the module cache, so the build uses a scratch copy of the
# module (removed at exit; nothing of upstream's is kept or committed).
#
# Environment:
#   INTEROP_RUST_BIN_DIR   our proxy-server and proxy-agent (default target/debug)
#   RUNS                   runs per pairing (default 3)
#   PAIRS                  pairings, default "agent=ours server=ours agent=ours,server=ours"
#                          ("upstream" is the control: upstream's agent and server)
#   SUITE_FLAGS            extra test flags, e.g. "-test.run TestProxyHandle_AfterDrain"
#   SUITE_LOG_DIR          keep each run's full log there
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
bin="${INTEROP_RUST_BIN_DIR:-$root/target/debug}"
runs="${RUNS:-3}"
pairs="${PAIRS:-agent=ours server=ours agent=ours,server=ours}"

# TestProxyDial_AgentTimeout_GRPC dials 198.18.0.254: our tests send traffic
# to loopback only, so it never runs here (its behaviour, a dial failing via
# the agent's 5 s timeout, is the interop suite's "accept queue full" case).
skip='^TestProxyDial_AgentTimeout_GRPC$'

scratch="$(mktemp -d)"
trap 'chmod -R u+w "$scratch" 2>/dev/null; rm -rf "$scratch"' EXIT
cd "$here"
anp="$(go list -m -f '{{.Dir}}' sigs.k8s.io/apiserver-network-proxy)"
cp -r "$anp" "$scratch/anp"
chmod -R u+w "$scratch/anp"
cp go.mod "$scratch/go.mod"
cp go.sum "$scratch/go.sum"
echo "replace sigs.k8s.io/apiserver-network-proxy => $scratch/anp" >>"$scratch/go.mod"
printf '{"Replace": {"%s": "%s"}}\n' "$scratch/anp/tests/zz_external_server_test.go" "$here/testdata/zz_external_server_test.go" >"$scratch/overlay.json"
echo "==> go test -c sigs.k8s.io/apiserver-network-proxy/tests (v0.36.0, with our external-server runner)" >&2
go test -modfile="$scratch/go.mod" -overlay="$scratch/overlay.json" -c -o "$scratch/suite.test" sigs.k8s.io/apiserver-network-proxy/tests

status=0
for pair in $pairs; do
  args=()
  envs=()
  case "$pair" in
    *agent=ours*) args+=("-agent-path=$bin/proxy-agent") ;;
  esac
  case "$pair" in
    *server=ours*) envs+=("UPSTREAM_SUITE_SERVER_PATH=$bin/proxy-server") ;;
  esac
  for i in $(seq 1 "$runs"); do
    echo "==> upstream's suite, $pair, run $i of $runs" >&2
    # shellcheck disable=SC2086
    if ! (cd "$scratch" && env "${envs[@]}" ./suite.test "${args[@]}" -test.skip "$skip" -test.timeout 20m -test.v ${SUITE_FLAGS:-} >"$scratch/run.log" 2>&1); then
      status=1
    fi
    if [ -n "${SUITE_LOG_DIR:-}" ]; then
      mkdir -p "$SUITE_LOG_DIR" && cp "$scratch/run.log" "$SUITE_LOG_DIR/${pair//[=,]/_}-$i.log"
    fi
    grep -E '^--- (PASS|FAIL|SKIP)' "$scratch/run.log" | sed "s/^/[$pair #$i] /"
    grep -E '^(PASS|FAIL|ok)$' "$scratch/run.log" | sed "s/^/[$pair #$i] /" || true
  done
done
exit $status
