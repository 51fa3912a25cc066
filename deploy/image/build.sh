#!/usr/bin/env bash
# Builds the images deploy/docker/Dockerfile describes as OCI image archives,
# without a container daemon or a registry:
#
#   deploy/image/build.sh OUT_DIR ARCH=BIN_DIR [ARCH=BIN_DIR ...]
#
# ARCH is amd64 or arm64; BIN_DIR holds that architecture's five binaries as
# deploy/docker/build-binaries.sh makes them. For each image, OUT_DIR gets
# IMAGE.oci.tar: an OCI image layout (tar) whose index lists one image per
# ARCH given, which `skopeo copy oci-archive:...`, `crane push` or
# `docker load` take (docs/releasing.md). With SBOM=1 each image and
# architecture also gets IMAGE_ARCH.cdx.json, a CycloneDX SBOM. Beside them
# go digests.txt (each image's index and per-architecture manifest digests)
# and SHA256SUMS.
#
# The base is assembled from the Debian packages pinned in packages.lock (C
# library, libgcc_s, CA certificates, time zones; the uid/gid 65532 user,
# no shell), the way distroless assembles its own. Tools: crane and syft at
# the versions deploy/image/tools/go.mod pins, built with Go. Two builds of
# the same commit give the same digests: layers are tar files with sorted
# entries, owner 0 (the nonroot home 65532), every mtime SOURCE_DATE_EPOCH
# (default: the commit's time), and the config has no build time.
#
# VERSION (default: Cargo.toml's) and SOURCE_COMMIT (default: git's) label
# the images; IMAGE_CACHE (default ~/.cache/konnectivity-images) keeps the
# downloaded .deb files, so a rebuild needs no network.
set -euo pipefail
umask 022
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
. "$here/apt.sh"

[ $# -ge 2 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
mkdir -p "$1"
out="$(cd "$1" && pwd)"
shift
for a in "$@"; do
  case "${a%%=*}" in
    amd64 | arm64) [ -d "${a#*=}" ] || { echo "error: $a: no such directory" >&2; exit 1; } ;;
    *) echo "error: '$a': expected amd64=DIR or arm64=DIR" >&2; exit 2 ;;
  esac
done
version="${VERSION:-$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml")}"
commit="${SOURCE_COMMIT:-$(git -C "$root" rev-parse --short=12 HEAD)}"
epoch="${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct)}"
created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"

work="$(mktemp -d "${TMPDIR:-/tmp}/image-build.XXXXXX")"
registry_pid=""
cleanup() {
  if [ -n "$registry_pid" ]; then kill "$registry_pid" 2>/dev/null || true; wait "$registry_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# --- tools -----------------------------------------------------------------
tools="$root/target/image-tools"
build_tools() {
  local want=(github.com/google/go-containerregistry/cmd/crane)
  [ "${SBOM:-0}" = 1 ] && want+=(github.com/anchore/syft/cmd/syft)
  mkdir -p "$tools"
  (cd "$here/tools" && go build -trimpath -o "$tools/" "${want[@]}")
}
build_tools
crane="$tools/crane"

# --- the base: pinned Debian packages ----------------------------------------
debs="$image_cache/debs"
mkdir -p "$debs"
updated=""
# fetch ARCH PACKAGE VERSION SHA256: the .deb into the cache, checked.
fetch() {
  local arch="$1" pkg="$2" ver="$3" sum="$4" file="$debs/$4.deb"
  [ -f "$file" ] && return 0
  if [ -z "$updated" ]; then apt_update; updated=1; fi
  local spec="$pkg=$ver" dl="$work/download"
  [ "$arch" = all ] || spec="$pkg:$arch=$ver"
  rm -rf "$dl" && mkdir -p "$dl"
  if ! (cd "$dl" && apt-get -q=2 download "$spec" >&2); then
    echo "error: Debian no longer serves $spec (deploy/image/packages.lock): re-pin with deploy/image/pin.sh > deploy/image/packages.lock" >&2
    exit 1
  fi
  local got
  got="$(sha256sum "$dl"/*.deb | cut -d' ' -f1)"
  if [ "$got" != "$sum" ]; then
    echo "error: $spec has sha256 $got, packages.lock pins $sum" >&2
    exit 1
  fi
  mv "$dl"/*.deb "$file"
}

# Entries sorted by name, owner root, mtime SOURCE_DATE_EPOCH, no atime or
# ctime: the same files give the same bytes. Extra arguments go to tar.
det_tar() {
  local dir="$1" file="$2"
  shift 2
  (cd "$dir" && LC_ALL=C tar --sort=name --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    --mtime="@$epoch" --owner=0 --group=0 --numeric-owner "$@" -f "$file" \
    $(LC_ALL=C ls -A))
}

# base ARCH: the base layer's tar for ARCH, in $work/base-ARCH.tar.
base() {
  local arch="$1"
  local fs="$work/base-$arch"
  mkdir -p "$fs/var/lib/dpkg/status.d"
  local a pkg ver sum
  while read -r a pkg ver sum; do
    case "$a" in "#"* | "") continue ;; esac
    [ "$a" = all ] || [ "$a" = "$arch" ] || continue
    fetch "$a" "$pkg" "$ver" "$sum"
    dpkg-deb -x "$debs/$sum.deb" "$fs"
    # Scanners (syft, trivy) read installed packages here, as in distroless.
    dpkg-deb -f "$debs/$sum.deb" >"$fs/var/lib/dpkg/status.d/$pkg"
  done <"$here/packages.lock"
  # Documentation but the licences, and maintainer tools that need a shell.
  find "$fs/usr/share/doc" -mindepth 1 -not -type d -not -name copyright -delete
  find "$fs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$fs/usr/share/man" "$fs/usr/share/info" "$fs/usr/share/lintian" "$fs/usr/share/locale" \
    "$fs/usr/sbin/update-ca-certificates" "$fs/usr/sbin/tzconfig" "$fs/etc/ca-certificates"
  # What update-ca-certificates would write: every certificate, one bundle.
  mkdir -p "$fs/etc/ssl/certs"
  find "$fs/usr/share/ca-certificates" -name '*.crt' -print0 | LC_ALL=C sort -z |
    xargs -0 cat >"$fs/etc/ssl/certs/ca-certificates.crt"
  cp "$here/rootfs/etc/passwd" "$here/rootfs/etc/group" "$here/rootfs/etc/nsswitch.conf" "$fs/etc/"
  chmod 0644 "$fs/etc/passwd" "$fs/etc/group" "$fs/etc/nsswitch.conf" "$fs/etc/ssl/certs/ca-certificates.crt"
  mkdir -p "$fs/tmp" "$fs/root" "$fs/home/nonroot"
  chmod 1777 "$fs/tmp"
  chmod 0700 "$fs/root" "$fs/home/nonroot"
  det_tar "$fs" "$work/base-$arch.tar" -c --exclude=home/nonroot
  (cd "$fs" && LC_ALL=C tar --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    --mtime="@$epoch" --owner=65532 --group=65532 --numeric-owner -r -f "$work/base-$arch.tar" home/nonroot)
}

# --- the images --------------------------------------------------------------
# IMAGE: entrypoint, description, then PATH=BINARY pairs (BINARY from the
# architecture's binary directory, or a repository file); the layouts of
# deploy/docker/Dockerfile's targets (tests/tests/images.rs holds the two to
# each other).
images=(proxy-server proxy-agent nodeport-proxy tunnel-agent lb-updater kkp-nodeport-proxy kkp-envoy)
layout() {
  case "$1" in
    proxy-server) echo "/proxy-server|Konnectivity proxy-server, wire-compatible with apiserver-network-proxy v0.36|/proxy-server=bin:proxy-server" ;;
    proxy-agent) echo "/proxy-agent|Konnectivity proxy-agent, wire-compatible with apiserver-network-proxy v0.36|/proxy-agent=bin:proxy-agent" ;;
    nodeport-proxy) echo "/nodeport-proxy|KKP nodeport-proxy (envoy-manager and Envoy) in one process|/nodeport-proxy=bin:nodeport-proxy" ;;
    tunnel-agent) echo "/tunnel-agent|KKP envoy-agent: node listeners tunneled to the seed over HTTP/2 CONNECT|/tunnel-agent=bin:tunnel-agent" ;;
    lb-updater) echo "/lb-updater|KKP nodeport-proxy lb-updater: the LoadBalancer Service's ports|/lb-updater=bin:lb-updater" ;;
    kkp-nodeport-proxy) echo "/envoy-manager|nodeport-proxy and lb-updater in the layout of KKP's nodeport-proxy image|/nodeport-proxy=bin:nodeport-proxy /envoy-manager=bin:nodeport-proxy /bin/cp=bin:nodeport-proxy /lb-updater=bin:lb-updater /envoy.yaml=repo:deploy/docker/kkp-envoy.yaml" ;;
    kkp-envoy) echo "/usr/local/bin/envoy|tunnel-agent in the layout of the Envoy image KKP runs as envoy-agent and beside envoy-manager|/tunnel-agent=bin:tunnel-agent /usr/local/bin/envoy=bin:tunnel-agent" ;;
  esac
}

# app IMAGE ARCH BIN_DIR: the image's own layer; copies of one binary are
# hard links, stored once.
app() {
  local img="$1" arch="$2" bins="$3" spec entry dest src
  local fs="$work/app-$img-$arch"
  mkdir -p "$fs"
  IFS='|' read -r entry _ spec <<<"$(layout "$img")"
  declare -A placed=()
  for entry in $spec; do
    dest="$fs${entry%%=*}"
    src="${entry#*=}"
    mkdir -p "$(dirname "$dest")"
    if [ -n "${placed[$src]:-}" ]; then
      ln "${placed[$src]}" "$dest"
      continue
    fi
    case "$src" in
      bin:*) cp "$bins/${src#bin:}" "$dest" && chmod 0755 "$dest" ;;
      repo:*) cp "$root/${src#repo:}" "$dest" && chmod 0644 "$dest" ;;
    esac
    placed[$src]="$dest"
  done
  find "$fs" -type d -exec chmod 0755 {} +
  det_tar "$fs" "$work/app-$img-$arch.tar" -c
}

# The images are put together by crane against a registry of its own, in
# memory, on loopback; nothing leaves this machine.
"$crane" registry serve --address 127.0.0.1:0 2>"$work/registry.log" &
registry_pid=$!
port=""
for _ in $(seq 1 100); do
  port="$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$work/registry.log")"
  [ -n "$port" ] && break
  kill -0 "$registry_pid" 2>/dev/null || { cat "$work/registry.log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "error: crane's registry did not start: $(cat "$work/registry.log")" >&2; exit 1; }
reg="127.0.0.1:$port"

mkdir -p "$out"
: >"$out/digests.txt"
for a in "$@"; do base "${a%%=*}"; done
for img in "${images[@]}"; do
  IFS='|' read -r entry desc _ <<<"$(layout "$img")"
  manifests=()
  for a in "$@"; do
    arch="${a%%=*}"
    app "$img" "$arch" "$(cd "${a#*=}" && pwd)"
    ref="$reg/$img:$version-$arch"
    "$crane" append --oci-empty-base -f "$work/base-$arch.tar" -f "$work/app-$img-$arch.tar" -t "$ref" >/dev/null 2>"$work/crane.log" ||
      { cat "$work/crane.log" >&2; exit 1; }
    "$crane" mutate "$ref" -t "$ref" --set-platform "linux/$arch" --user 65532:65532 \
      --entrypoint "$entry" \
      --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
      -l org.opencontainers.image.title="$img" \
      -l org.opencontainers.image.description="$desc" \
      -l org.opencontainers.image.version="$version" \
      -l org.opencontainers.image.revision="$commit" \
      -l org.opencontainers.image.created="$created" \
      -l org.opencontainers.image.licenses=Apache-2.0 \
      -l org.opencontainers.image.base.name="debian:bookworm packages (deploy/image/packages.lock)" \
      >/dev/null 2>"$work/crane.log" || { cat "$work/crane.log" >&2; exit 1; }
    manifests+=(-m "$ref")
    echo "$img $arch $("$crane" digest "$ref")" >>"$out/digests.txt"
  done
  "$crane" index append "${manifests[@]}" -t "$reg/$img:$version" >/dev/null 2>"$work/crane.log" ||
    { cat "$work/crane.log" >&2; exit 1; }
  echo "$img index $("$crane" digest "$reg/$img:$version")" >>"$out/digests.txt"
  rm -rf "$work/layout-$img"
  "$crane" pull --format=oci "$reg/$img:$version" "$work/layout-$img" 2>"$work/crane.log" ||
    { cat "$work/crane.log" >&2; exit 1; }
  # crane writes blobs 0600: readable by all, as any layout a registry serves.
  find "$work/layout-$img" -type d -exec chmod 0755 {} + -o -type f -exec chmod 0644 {} +
  det_tar "$work/layout-$img" "$out/$img.oci.tar" -c
  rm -rf "$work/layout-$img" "$work/app-$img-"*
  echo "$img:$version -> $out/$img.oci.tar" >&2
done

if [ "${SBOM:-0}" = 1 ]; then
  for img in "${images[@]}"; do
    for a in "$@"; do
      arch="${a%%=*}"
      SYFT_CHECK_FOR_APP_UPDATE=false "$tools/syft" scan -q "oci-archive:$out/$img.oci.tar" \
        --platform "linux/$arch" --source-name "$img" --source-version "$version" \
        -o "cyclonedx-json=$out/${img}_$arch.cdx.json"
    done
  done
fi
(cd "$out" && sha256sum -- *.oci.tar $(ls ./*.cdx.json 2>/dev/null | sed 's,^\./,,') >SHA256SUMS)
