#!/usr/bin/env bash
# Builds the Kubernetes test harness binaries into $K8S_BIN_DIR (default
# tests/k8s/bin): kube-apiserver and kubectl from k8s.io/kubernetes v1.36.1,
# etcd (embedded go.etcd.io/etcd/server/v3, the version Kubernetes pins) and
# the kubelet stand-in, and kubeconform (the schema validator of deploy/'s
# manifests, its own module in kubeconform/). Go's build cache makes a second
# run a no-op; a cold run (empty GOMODCACHE and GOCACHE) is measured in
# README.md.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${K8S_BIN_DIR:-$here/bin}"
min_go="1.26.0"
if ! command -v go >/dev/null 2>&1; then
  echo "error: the Kubernetes tests need Go $min_go or newer on PATH (https://go.dev/doc/install)" >&2
  exit 1
fi
have_go="$(go env GOVERSION)"; have_go="${have_go#go}"
if [ "$(printf '%s\n%s\n' "$min_go" "${have_go%%[-+ ]*}" | sort -V | head -n1)" != "$min_go" ]; then
  echo "error: the Kubernetes tests need Go $min_go or newer (k8s.io/kubernetes v1.36's go.mod); found go$have_go" >&2
  exit 1
fi
mkdir -p "$bin"
bin="$(cd "$bin" && pwd)"
cd "$here"
v=k8s.io/component-base/version
cv=k8s.io/client-go/pkg/version
ldflags="-s -w"
for p in "$v" "$cv"; do
  ldflags+=" -X $p.gitVersion=v1.36.1 -X $p.gitMajor=1 -X $p.gitMinor=36 -X $p.gitTreeState=clean"
done
start=$(date +%s)
CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly" go build -ldflags "$ldflags" -o "$bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl ./cmd/etcd ./cmd/kubelet
CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly" go build -C kubeconform -ldflags "-s -w" -o "$bin/" \
  github.com/yannh/kubeconform/cmd/kubeconform
echo "k8s harness binaries in $bin ($(( $(date +%s) - start ))s)" >&2
