#!/usr/bin/env bash
# The Kubernetes version matrix: tests/tests/k8s_egress.rs (kube-apiserver's
# `cluster` egress through our proxy-server over GRPC and HTTPConnect, and
# the real kubectl's logs, logs -f, exec and port-forward through it) once
# per kube-apiserver release (default: v1.34.3, v1.35.2, v1.36.1 and v1.37.2),
# with that release's kubectl: v1.36.1 is tests/k8s/build.sh's (the one
# scripts/test runs), the others are tests/k8s/apiserver/<version>/. Builds what is missing (tests/k8s/build.sh,
# tests/k8s/build-matrix.sh; a cold build of one release takes minutes).
#   tests/k8s/matrix.sh                      # every release
#   tests/k8s/matrix.sh v1.37.2 v1.34.3      # some
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export K8S_BIN_DIR="${K8S_BIN_DIR:-$here/bin}"
matrix="${K8S_MATRIX_DIR:-$here/bin/matrix}"
harness=v1.36.1 # tests/k8s/build.sh's
if [ $# -eq 0 ]; then
  set -- $( (cd "$here/apiserver" && ls -d v*; echo "$harness") | sort -V)
fi
"$here/build.sh"
others=()
for ver in "$@"; do [ "$ver" = "$harness" ] || others+=("$ver"); done
if [ ${#others[@]} -gt 0 ]; then
  K8S_MATRIX_DIR="$matrix" "$here/build-matrix.sh" "${others[@]}"
fi
(cd "$root" && cargo build --bins -p proxy-server -p proxy-agent)
for ver in "$@"; do
  echo "==> kube-apiserver $ver: cargo test --test k8s_egress" >&2
  dir="$matrix/$ver"
  [ "$ver" = "$harness" ] && dir="$K8S_BIN_DIR"
  (cd "$root" && K8S_APISERVER_DIR="$dir" K8S_APISERVER_VERSION="$ver" \
    cargo test -p integration-tests --test k8s_egress)
done
echo "Kubernetes version matrix passed: $*" >&2
