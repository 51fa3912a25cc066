#!/usr/bin/env bash
# Builds the five binaries the images ship, exactly as the Dockerfile's build
# stage does (it runs this script), and copies them into OUT_DIR:
#   deploy/docker/build-binaries.sh [ARCH [OUT_DIR]]
# ARCH is a Docker architecture (amd64 or arm64; default: this machine's);
# OUT_DIR defaults to target/image/ARCH. Profile `dist` (Cargo.toml): release
# code, no debug info, stripped. For an arch other than this machine's it
# cross-compiles with Debian's gcc-<triple> (the Dockerfile installs it).
# SOURCE_COMMIT names the commit for --version when there is no .git.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
host_arch() {
  case "$(uname -m)" in
    x86_64) echo amd64 ;;
    aarch64 | arm64) echo arm64 ;;
    *) uname -m ;;
  esac
}
arch="${1:-$(host_arch)}"
out="${2:-$root/target/image/$arch}"
case "$arch" in
  amd64) triple=x86_64-unknown-linux-gnu ;;
  arm64) triple=aarch64-unknown-linux-gnu ;;
  *) echo "error: unsupported architecture '$arch' (amd64 or arm64)" >&2; exit 1 ;;
esac
bins=(proxy-server proxy-agent nodeport-proxy tunnel-agent lb-updater)

if [ "$arch" != "$(host_arch)" ]; then
  gnu="${triple%%-unknown-*}-linux-gnu"
  if ! command -v "$gnu-gcc" >/dev/null 2>&1; then
    echo "error: cross-compiling for $arch needs $gnu-gcc: apt-get install -y gcc-${gnu//_/-} libc6-dev-$arch-cross" >&2
    exit 1
  fi
  upper="$(echo "$triple" | tr 'a-z-' 'A-Z_')"
  export "CARGO_TARGET_${upper}_LINKER=$gnu-gcc" "CC_${triple//-/_}=$gnu-gcc"
fi
if [ "$arch" = arm64 ]; then
  # jemalloc must not assume 4 KiB pages: arm64 kernels with 16 or 64 KiB
  # pages exist (RHEL, Ampere); 64 KiB works on all of them.
  export JEMALLOC_SYS_WITH_LG_PAGE=16
fi
if [ "$(rustc -vV | sed -n 's/^host: //p')" != "$triple" ]; then
  rustup target list --installed | grep -qx "$triple" || rustup target add "$triple"
fi

args=()
for b in "${bins[@]}"; do args+=(-p "$b" --bin "$b"); done
(cd "$root" && cargo build --locked --profile dist --target "$triple" "${args[@]}")
mkdir -p "$out"
for b in "${bins[@]}"; do
  cp "$root/target/$triple/dist/$b" "$out/$b"
done
echo "image binaries for $arch in $out" >&2
