# Sourced by pin.sh and build.sh: apt-get and apt-cache with a private state
# and cache directory (under $IMAGE_CACHE), the machine's own Debian sources,
# and both image architectures, so nothing is installed and the machine's apt
# configuration is left as it is. Needs a Debian machine whose sources name
# the suite the base is pinned to (packages.lock).
image_cache="${IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/konnectivity-images}"
apt_dir="$image_cache/apt"

private_apt() {
  mkdir -p "$apt_dir/state/lists/partial" "$apt_dir/cache/archives/partial"
  touch "$apt_dir/state/status"
  cat >"$apt_dir/apt.conf" <<CONF
Dir::State "$apt_dir/state";
Dir::State::status "$apt_dir/state/status";
Dir::Cache "$apt_dir/cache";
APT::Architecture "amd64";
APT::Architectures { "amd64"; "arm64"; };
Acquire::Languages "none";
APT::Sandbox::User "root";
CONF
  export APT_CONFIG="$apt_dir/apt.conf"
}

apt_update() {
  private_apt
  apt-get -q=2 update >&2
}
