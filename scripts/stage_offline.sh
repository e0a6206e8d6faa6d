#!/usr/bin/env bash
# Stage the Debian packages memlab needs into a git-ignored folder of the checkout, so that
# scripts/build_offline.sh can build on a host without package access.
#
#   bash scripts/stage_offline.sh [--full-boost] [DIR]        (DIR defaults to <repo>/.offline)
#
# Run on a Debian 12 (bookworm) machine with package access; the .debs are for its architecture.
# Needs no root unless the apt lists are missing (then it runs apt-get update, via sudo if not root).
# libboost1.74-dev is repacked with only the headers memlab's sources reach (found by the C++ compiler) and its
# CMake files: 1 MB instead of 9.5, so a sweep store's checkpoints fit beside it in a 64 MiB transfer.
# --full-boost keeps the whole package.
set -euo pipefail

PACKAGES=(libyaml-cpp0.7 libyaml-cpp-dev libfmt9 libfmt-dev libcli11-dev libboost1.74-dev
          libgtest-dev googletest libsqlite3-0 libsqlite3-dev)

log() { echo "memlab stage: $*"; }
die() { echo "memlab stage: ERROR: $*" >&2; exit 1; }

FULL_BOOST=0
case "${1:-}" in
  -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --full-boost) FULL_BOOST=1; shift ;;
  -*) die "unknown option '$1' (usage: stage_offline.sh [--full-boost] [DIR])" ;;
esac
[[ $# -le 1 ]] || die "too many arguments (usage: stage_offline.sh [--full-boost] [DIR])"

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

# Boost is header-only here: keep the headers that memlab's boost includes reach, whole for each boost/ folder
# they touch (another compiler's config may take a sibling header), all of boost/config, and the CMake files.
trim_boost() {
  local deb tree kept cxx
  deb="$(compgen -G "$TMP/libboost1.74-dev_*.deb")" || die "no libboost1.74-dev .deb downloaded"
  cxx="$(command -v c++ || command -v g++)" || die "no C++ compiler to find the boost headers (or pass --full-boost)"
  tree="$TMP/boost.full" kept="$TMP/boost.kept"
  dpkg-deb -R "$deb" "$tree"
  git -C "$REPO_ROOT" grep -h '^#include <boost/' -- '*.h' '*.cpp' '*.cu' | sort -u > "$TMP/boost.cpp"
  [[ -s "$TMP/boost.cpp" ]] || die "memlab's sources include no boost header; nothing to trim by"
  (cd "$tree" && "$cxx" -std=c++17 -M -I usr/include -x c++ "$TMP/boost.cpp" | tr ' \\' '\n\n' \
     | grep '^usr/include/boost/' | sort -u) > "$TMP/boost.deps"
  mkdir -p "$kept"
  (cd "$tree" && {
     cat "$TMP/boost.deps"
     sed -E 's#^(usr/include/boost/[^/]+)/.*#\1#' "$TMP/boost.deps" | sort -u | while read -r d; do
       [[ -d "$d" ]] && find "$d" -type f; done
     find usr/include/boost/config usr/lib -type f
     find usr/share/doc -type f 2>/dev/null || true
   } | sort -u | tar cf - -T - | tar xf - -C "$kept") || die "copying the kept boost headers failed"
  cp -r "$tree/DEBIAN" "$kept/"
  "$cxx" -std=c++17 -fsyntax-only -I "$kept/usr/include" -x c++ "$TMP/boost.cpp" \
    || die "the trimmed boost headers do not compile memlab's boost includes (or pass --full-boost)"
  rm -f "$deb"
  dpkg-deb -Zxz -b "$kept" "$deb" > /dev/null
  rm -rf "$tree" "$kept"
  log "libboost1.74-dev repacked with the headers memlab reaches: $(du -h "$deb" | cut -f1)"
}
[[ $FULL_BOOST == 1 ]] || trim_boost

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
