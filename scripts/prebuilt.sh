#!/usr/bin/env bash
# Run memlab on a GPU machine without building it there: build here, carry one archive, unpack there. Both machines
# need the same torch (2.11, the same CUDA build) and x86-64 Linux; the GPU machine needs no compiler.
#
#   bash scripts/prebuilt.sh pack [--build-dir DIR] [--out FILE]
#       here, after a build configured with -DMEMLAB_CAIRO=OFF and the GPU's architecture (e.g.
#       -DMEMLAB_CUDA_ARCHITECTURES=90): strips memlab and memlab_gpu_tests into one xz archive (default
#       .offline/memlab-bin.txz, beside the staged .debs).
#   bash scripts/prebuilt.sh unpack [--build-dir DIR] [--in FILE]
#       there: unpacks the binaries into DIR (default build/), the runtime .debs of .offline (yaml-cpp, SQLite) into
#       a prefix as scripts/build_offline.sh does, and writes DIR/env.sh, which exports LD_LIBRARY_PATH (torch, its
#       CUDA runtime, the prefix). Then: source build/env.sh; build/memlab ...; build/memlab_gpu_tests
#
# Why: a build with its tests takes about 160 s on a 16-core GPU machine, a tenth of a 30-minute lease. The archive
# is about 31 MB: the two binaries hold the same kernels, and one xz stream with a dictionary larger than a binary
# stores them once.
set -euo pipefail

die() { echo "error: $*" >&2; exit 2; }
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${1:-}" in
  -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  pack|unpack) MODE="$1"; shift ;;
  *) die "usage: prebuilt.sh pack|unpack [--build-dir DIR] [--out FILE | --in FILE] (try --help)" ;;
esac
BUILD_DIR="$REPO_ROOT/build"
ARCHIVE="$REPO_ROOT/.offline/memlab-bin.txz"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) [[ $# -ge 2 ]] || die "--build-dir needs a directory"; BUILD_DIR="$(realpath -m "$2")"; shift 2 ;;
    --out|--in) [[ $# -ge 2 ]] || die "$1 needs a file"; ARCHIVE="$(realpath -m "$2")"; shift 2 ;;
    *) die "unknown argument '$1' (try --help)" ;;
  esac
done
BINS=(memlab memlab_gpu_tests)

if [[ "$MODE" == pack ]]; then
  for b in "${BINS[@]}"; do [[ -x "$BUILD_DIR/$b" ]] || die "no $BUILD_DIR/$b: build it first (with tests)"; done
  # cairo is the one library memlab links that a GPU machine without packages may lack.
  if ldd "$BUILD_DIR/memlab" | grep libcairo >/dev/null; then
    die "$BUILD_DIR/memlab links cairo: configure with -DMEMLAB_CAIRO=OFF (plots are drawn where the results are read)"
  fi
  command -v cuobjdump >/dev/null 2>&1 &&
    echo "prebuilt: kernels for $(cuobjdump --list-elf "$BUILD_DIR/memlab" 2>/dev/null | grep -o 'sm_[0-9]*' | sort -u | tr '\n' ' ')"
  mkdir -p "$(dirname "$ARCHIVE")"
  tmp="$(mktemp -d "$(dirname "$ARCHIVE")/.pack.XXXXXX")"  # beside the archive: the final mv is a rename
  trap 'rm -rf "$tmp"' EXIT
  for b in "${BINS[@]}"; do strip -o "$tmp/$b" "$BUILD_DIR/$b"; done
  python3 -c 'import torch; print(torch.__version__)' > "$tmp/torch_version" 2>/dev/null ||
    die "python3 cannot import torch (the torch that memlab was built against)"
  # One stream (-T1) with a 256 MiB dictionary: the second binary's kernels are matched against the first's.
  tar cf - -C "$tmp" torch_version "${BINS[@]}" | xz -T1 --lzma2=preset=6,dict=256MiB > "$tmp/archive.txz"
  mv "$tmp/archive.txz" "$ARCHIVE"
  echo "prebuilt: $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1)); carry it with the repository, then on the GPU machine:"
  echo "  bash scripts/prebuilt.sh unpack && source build/env.sh"
  exit 0
fi

[[ -f "$ARCHIVE" ]] || die "no archive at $ARCHIVE (make it with 'prebuilt.sh pack' where memlab was built)"
TORCH_DIR="$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)" ||
  die "python3 cannot import torch (the binaries load torch 2.11's libraries)"
command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb is needed to unpack the staged .debs"
mkdir -p "$BUILD_DIR"
tmp="$(mktemp -d "$BUILD_DIR/.unpack.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
xz -dc "$ARCHIVE" | tar xf - -C "$tmp" || die "cannot unpack $ARCHIVE"
[[ -f "$tmp/torch_version" ]] || die "$ARCHIVE is not an archive of prebuilt.sh pack (no torch_version)"
built="$(cat "$tmp/torch_version")" there="$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)"
[[ "$built" == "$there" ]] || die "the binaries were built against torch $built, this machine has $there: build here"
PREFIX="${MEMLAB_DEPS:-$HOME/.memlab-deps}"
mkdir -p "$PREFIX"
for p in libyaml-cpp0.7 libsqlite3-0; do
  debs=()
  while IFS= read -r d; do debs+=("$d"); done < <(compgen -G "$REPO_ROOT/.offline/${p}_*.deb" | sort -V)
  [[ ${#debs[@]} -gt 0 ]] || die "$REPO_ROOT/.offline lacks ${p}_*.deb (run scripts/stage_offline.sh and carry .offline)"
  dpkg-deb -x "${debs[-1]}" "$PREFIX"  # the newest staged version
done
LIBS="$PREFIX/usr/lib/$(uname -m)-linux-gnu:$TORCH_DIR/lib:$TORCH_DIR/../nvidia/cu13/lib:/usr/local/cuda/lib64"
missing="$(LD_LIBRARY_PATH="$LIBS" ldd "$tmp/memlab" | grep 'not found' || true)"
[[ -z "$missing" ]] || die "the binaries cannot find: $missing"
printf 'export LD_LIBRARY_PATH=%q"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n' "$LIBS" > "$tmp/env.sh"
for f in "${BINS[@]}" env.sh; do mv "$tmp/$f" "$BUILD_DIR/$f"; done
echo "prebuilt: ${BINS[*]} in $BUILD_DIR; source $BUILD_DIR/env.sh before running them"
