#!/usr/bin/env bash
# Installs the Debian packages the benchmark harness (scripts/bench) needs:
# the anchors it compares against and the tools it measures with.
#   haproxy             mode tcp relay and req.ssl_sni routing (P1 anchor, P7, NodePort)
#   nginx +
#   libnginx-mod-stream stream {} with ssl_preread (P7, NodePort)
#   tinyproxy           HTTP/1.1 CONNECT proxy (P8 anchor)
#   linux-perf          profiles for BENCHMARKS.md (optional: only if available)
# Idempotent: does nothing when everything is already there. Needs root (or
# sudo without a password) and Debian's package repositories; exits non-zero
# with the reason otherwise. Never starts the packages' system services.
set -euo pipefail

need_bins=(haproxy nginx tinyproxy)
missing=()
for b in "${need_bins[@]}"; do
  p="$(command -v "$b" 2>/dev/null || true)"
  [ -z "$p" ] && [ -x "/usr/sbin/$b" ] && p="/usr/sbin/$b"
  [ -z "$p" ] && [ -x "/usr/bin/$b" ] && p="/usr/bin/$b"
  [ -z "$p" ] && missing+=("$b")
done
stream_mod=""
for f in /usr/lib/nginx/modules/ngx_stream_module.so /usr/share/nginx/modules/ngx_stream_module.so; do
  [ -f "$f" ] && stream_mod="$f"
done
[ -z "$stream_mod" ] && missing+=("nginx-stream-module")

if [ "${#missing[@]}" -eq 0 ]; then
  echo "benches/install-deps.sh: haproxy, nginx (stream module) and tinyproxy are installed" >&2
  exit 0
fi
echo "benches/install-deps.sh: missing: ${missing[*]}; installing with apt-get" >&2

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "error: the benchmarks need ${missing[*]} (Debian packages haproxy nginx libnginx-mod-stream tinyproxy)," >&2
    echo "and installing them needs root or password-less sudo. Run as root: apt-get install -y haproxy nginx libnginx-mod-stream tinyproxy" >&2
    exit 1
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: apt-get not found; install haproxy, nginx with the stream module (ssl_preread) and tinyproxy with your package manager" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# Keep the packages' own services from starting (we run private instances
# on loopback ports only): policy-rc.d answers 101 = "action not allowed".
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  $SUDO sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"
  created_policy=1
fi
cleanup() { if [ "$created_policy" = 1 ]; then $SUDO rm -f "$policy"; fi; }
trap cleanup EXIT

$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
  haproxy nginx libnginx-mod-stream tinyproxy >&2
# perf is optional (profiles only); do not fail the benchmarks without it.
if ! command -v perf >/dev/null 2>&1; then
  $SUDO apt-get install -y -qq --no-install-recommends linux-perf >&2 || \
    echo "benches/install-deps.sh: linux-perf not installable; profiles will be skipped" >&2
fi
# The services may have been started anyway (no systemd here, or a
# policy-rc.d that existed before): stop the ones dpkg started.
for s in haproxy nginx tinyproxy; do
  if command -v service >/dev/null 2>&1; then $SUDO service "$s" stop >/dev/null 2>&1 || true; fi
done
echo "benches/install-deps.sh: installed" >&2
