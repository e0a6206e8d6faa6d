#!/usr/bin/env bash
# Stage the Debian packages memlab needs into a git-ignored folder of the checkout, so that
# scripts/build_offline.sh can build on a host without package access.
#
#   bash scripts/stage_offline.sh [DIR]        (DIR defaults to <repo>/.offline)
#
# Run on a Debian 12 (bookworm) machine with package access; the .debs are for its architecture.
# Needs no root unless the apt lists are missing (then it runs apt-get update, via sudo if not root).
set -euo pipefail

PACKAGES=(libyaml-cpp0.7 libyaml-cpp-dev libfmt9 libfmt-dev libcli11-dev libboost1.74-dev
          libgtest-dev googletest libsqlite3-0 libsqlite3-dev)

log() { echo "memlab stage: $*"; }
die() { echo "memlab stage: ERROR: $*" >&2; exit 1; }

case "${1:-}" in
  -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) die "unknown option '$1' (usage: stage_offline.sh [DIR])" ;;
esac
[[ $# -le 1 ]] || die "too many arguments (usage: stage_offline.sh [DIR])"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$REPO_ROOT/.offline}"
[[ "$DEST" == /* ]] || DEST="$PWD/$DEST"
command -v apt-get >/dev/null 2>&1 || die "apt-get not found: run this on a Debian 12 machine with package access"

mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
TMP="$(mktemp -d "$DEST/.download.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

apt_opts=(-q)
# As root apt drops to the _apt user for downloads and warns it cannot write here; download as root instead.
[[ "$(id -u)" -ne 0 ]] || apt_opts+=(-o APT::Sandbox::User=root)

download() { (cd "$TMP" && apt-get "${apt_opts[@]}" download "${PACKAGES[@]}"); }

log "downloading ${PACKAGES[*]}"
if ! download; then
  log "apt-get download failed (package lists missing or stale?); running apt-get update and retrying"
  if [[ "$(id -u)" -eq 0 ]]; then
    apt-get -q update || die "apt-get update failed"
  elif command -v sudo >/dev/null 2>&1; then
    sudo apt-get -q update || die "sudo apt-get update failed"
  else
    die "apt-get download failed and apt-get update needs root (no sudo available)"
  fi
  download || die "apt-get download failed even after apt-get update"
fi

# Replace the previous set only once the whole download succeeded.
rm -f "$DEST"/*.deb "$DEST/SHA256SUMS"
mv "$TMP"/*.deb "$DEST"/
(cd "$DEST" && sha256sum ./*.deb | sed 's| \./| |' > SHA256SUMS)

log "staged into $DEST:"
for f in "$DEST"/*.deb; do
  printf '  %8s  %s\n' "$(du -h "$f" | cut -f1)" "$(basename "$f")"
done
total_bytes="$(du -cb "$DEST"/*.deb | tail -n1 | cut -f1)"
log "total size: $(du -sh "$DEST" | cut -f1) ($total_bytes bytes of .deb files)"
limit=$((40 * 1024 * 1024))
if (( total_bytes > limit )); then
  log "WARNING: more than 40 MiB; the folder may not fit a 64 MiB transfer next to the sources"
fi
