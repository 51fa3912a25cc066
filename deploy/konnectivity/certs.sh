#!/usr/bin/env bash
# Makes the two objects deploy/konnectivity mounts that a kustomization
# cannot make (they hold a key made here), in one command, before or after
# `kubectl apply -k deploy/`:
#
#   Secret    kube-system/konnectivity-server-tls  tls.crt, tls.key, ca.crt:
#             the certificate proxy-server presents on the agent port
#             (--cluster-cert, --cluster-key)
#   ConfigMap kube-system/konnectivity-ca          ca.crt: what proxy-agent
#             verifies it with (--ca-cert)
#
# The certificate is signed by a CA made here (EC P-256) whose key is not
# kept; it names the agent port's Service (konnectivity-server.kube-system.svc
# and .svc.cluster.local, what agent.yaml dials) and every extra name or IP
# address given, e.g. a load balancer's for agents outside the cluster:
#
#   deploy/konnectivity/certs.sh [NAME_OR_IP ...]
#
# An existing Secret is left alone (ROTATE=1 replaces both objects; the
# servers and agents reload the files when the kubelet updates them, the
# agents after the servers: see docs/kubernetes.md). Environment: KUBECTL
# (kubectl), NAMESPACE (kube-system), DAYS (validity, 825). Needs openssl.
set -euo pipefail
kubectl="${KUBECTL:-kubectl}"
ns="${NAMESPACE:-kube-system}"
days="${DAYS:-825}"
command -v openssl >/dev/null 2>&1 || {
  echo "certs.sh: openssl is required (e.g. apt-get install -y openssl)" >&2
  exit 1
}
if [ "${ROTATE:-0}" != 1 ] && "$kubectl" -n "$ns" get secret konnectivity-server-tls >/dev/null 2>&1; then
  echo "certs.sh: secret $ns/konnectivity-server-tls exists; left as it is (ROTATE=1 replaces it)" >&2
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
sans="DNS:konnectivity-server.$ns.svc,DNS:konnectivity-server.$ns.svc.cluster.local"
for name in "$@"; do
  if [[ "$name" =~ ^[0-9.]+$ || "$name" == *:* ]]; then
    sans+=",IP:$name"
  else
    sans+=",DNS:$name"
  fi
done
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$days" \
  -subj "/CN=konnectivity-ca" -keyout "$tmp/ca.key" -out "$tmp/ca.crt" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -subj "/CN=konnectivity-server" -keyout "$tmp/tls.key" -out "$tmp/tls.csr" 2>/dev/null
printf '%s\n' "subjectAltName=$sans" "basicConstraints=critical,CA:FALSE" \
  "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth" >"$tmp/ext"
openssl x509 -req -in "$tmp/tls.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" -CAcreateserial \
  -days "$days" -extfile "$tmp/ext" -out "$tmp/tls.crt" 2>/dev/null
"$kubectl" -n "$ns" create secret generic konnectivity-server-tls --type=kubernetes.io/tls \
  --from-file=tls.crt="$tmp/tls.crt" --from-file=tls.key="$tmp/tls.key" \
  --from-file=ca.crt="$tmp/ca.crt" --dry-run=client -o yaml | "$kubectl" apply -f - >/dev/null
"$kubectl" -n "$ns" create configmap konnectivity-ca --from-file=ca.crt="$tmp/ca.crt" \
  --dry-run=client -o yaml | "$kubectl" apply -f - >/dev/null
echo "certs.sh: made secret $ns/konnectivity-server-tls and configmap $ns/konnectivity-ca for $sans" >&2
