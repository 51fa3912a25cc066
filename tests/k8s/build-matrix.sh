#!/usr/bin/env bash
# Builds kube-apiserver and kubectl of every Kubernetes version in the
# matrix (tests/k8s/apiserver/v*/go.mod, each a module pinning one
# k8s.io/kubernetes release from the Go module proxy) into
# $K8S_MATRIX_DIR/<version>/ (default tests/k8s/bin/matrix/<version>/).
# Arguments: the versions to build (default: all). etcd and the kubelet
# stand-in stay tests/k8s/build.sh's (one build serves every version).
# tests/k8s/matrix.sh runs the Kubernetes egress tests against each.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${K8S_MATRIX_DIR:-$here/bin/matrix}"
if ! command -v go >/dev/null 2>&1; then
  echo "error: the Kubernetes version matrix needs Go 1.26 or newer on PATH (https://go.dev/doc/install)" >&2
  exit 1
fi
if [ $# -eq 0 ]; then
  set -- $(cd "$here/apiserver" && ls -d v* | sort -V)
fi
mkdir -p "$out"
out="$(cd "$out" && pwd)"
for ver in "$@"; do
  mod="$here/apiserver/$ver"
  if [ ! -f "$mod/go.mod" ]; then
    echo "error: no module for Kubernetes $ver in $mod (versions: $(cd "$here/apiserver" && ls -d v* | tr '\n' ' '))" >&2
    exit 1
  fi
  minor="${ver#v1.}"; minor="${minor%%.*}"
  ldflags="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$ver -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  mkdir -p "$out/$ver"
  start=$(date +%s)
  CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly" go build -C "$mod" -ldflags "$ldflags" -o "$out/$ver/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
  echo "kube-apiserver and kubectl $ver in $out/$ver ($(( $(date +%s) - start ))s)" >&2
done
