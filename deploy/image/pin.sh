#!/usr/bin/env bash
# Pins the base of the images (packages.lock) to the versions the machine's
# Debian sources serve now, with the sha256 of each .deb:
#
#   deploy/image/pin.sh > deploy/image/packages.lock
#
# Run it when a Debian point or security release supersedes a pinned
# package (build.sh then says which one the archive no longer serves), review
# the diff and say what changed in CHANGELOG.md.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/apt.sh"

# What distroless' cc image holds that our binaries use: the C library and
# libgcc_s (Rust's unwinder), CA certificates, time zones, and base-files'
# /etc/os-release and netbase's /etc/services for scanners and resolvers.
packages=(base-files netbase tzdata ca-certificates gcc-12-base libgcc-s1 libc6)

apt_update
echo "# The Debian packages the images' base is assembled from (deploy/image/build.sh),"
echo "# written by deploy/image/pin.sh on $(date -u +%Y-%m-%d) from $(. /etc/os-release && echo "$PRETTY_NAME")."
echo "# arch package version sha256 (arch 'all': one .deb for every architecture)"
for p in "${packages[@]}"; do
  for arch in amd64 arm64; do
    fields="$(apt-cache show --no-all-versions "$p:$arch" | awk '
      /^Architecture:/ {a=$2} /^Version:/ {v=$2} /^SHA256:/ {s=$2}
      END {print a, v, s}')"
    read -r a v s <<<"$fields"
    [ -n "$s" ] || { echo "error: no $p for $arch in the Debian sources" >&2; exit 1; }
    echo "$a $p $v $s"
    [ "$a" = all ] && break
  done
done
