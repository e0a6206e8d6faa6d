#!/usr/bin/env bash
# Build memlab on a host without package access (e.g. an Ubuntu 24.04 GPU box that already has
# python3 + torch 2.11, cmake, ninja and g++), from the .debs staged by scripts/stage_offline.sh.
#
#   bash scripts/build_offline.sh [--no-tests] [--build-dir DIR] [--prefix DIR] [--debs DIR] [-- CMAKE_ARGS...]
#
#   --debs DIR     where the staged .debs are (default <repo>/.offline; a bare DIR argument works too)
#   --prefix DIR   where they are unpacked with dpkg -x (default /opt/deps, or $HOME/.memlab-deps
#                  when /opt/deps is not writable); no root and no package database involved
#   --build-dir    build directory (default <repo>/build); BUILD/env.sh exports LD_LIBRARY_PATH
#   --no-tests     configure with -DMEMLAB_TESTS=OFF
# Then: ctest --test-dir build --output-on-failure
set -euo pipefail

log() { echo "memlab offline: $*"; }
die() { echo "memlab offline: ERROR: $*" >&2; exit 1; }
trap 'rc=$?; echo "memlab offline: ERROR: command failed (exit $rc) at line $LINENO: $BASH_COMMAND" >&2' ERR

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
abspath() { if [[ "$1" == /* ]]; then echo "$1"; else echo "$PWD/$1"; fi; }

TESTS=ON
BUILD_DIR="$REPO_ROOT/build"
DEBS_DIR="$REPO_ROOT/.offline"
PREFIX=""
EXTRA_CMAKE_ARGS=()
need_arg() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs an argument"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-tests) TESTS=OFF; shift ;;
    --build-dir) need_arg "$@"; BUILD_DIR="$(abspath "$2")"; shift 2 ;;
    --build-dir=*) BUILD_DIR="$(abspath "${1#*=}")"; shift ;;
    --prefix) need_arg "$@"; PREFIX="$(abspath "$2")"; shift 2 ;;
    --prefix=*) PREFIX="$(abspath "${1#*=}")"; shift ;;
    --debs) need_arg "$@"; DEBS_DIR="$(abspath "$2")"; shift 2 ;;
    --debs=*) DEBS_DIR="$(abspath "${1#*=}")"; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; EXTRA_CMAKE_ARGS=("$@"); break ;;
    -*) die "unknown option '$1' (try --help)" ;;
    *) DEBS_DIR="$(abspath "$1")"; shift ;;
  esac
done
cd "$REPO_ROOT"

# ---------------------------------------------------------------- tools
for t in python3 cmake; do
  command -v "$t" >/dev/null 2>&1 || die "$t not found on PATH"
done
command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || die "no C++ compiler (c++/g++) on PATH"
TORCH_CMAKE="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)" \
  || die "python3 cannot import torch (need torch 2.11 with its C++ libraries)"
TORCH_VERSION="$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)"
log "torch $TORCH_VERSION, cmake prefix $TORCH_CMAKE"
[[ "$TORCH_VERSION" == 2.11.* ]] || log "WARNING: torch $TORCH_VERSION is not 2.11.x; the build may not match"

# ---------------------------------------------------------------- the staged .debs
[[ -d "$DEBS_DIR" ]] || die "no staged packages at $DEBS_DIR (run scripts/stage_offline.sh on a machine with Debian package access and copy the folder here)"
shopt -s nullglob
debs=("$DEBS_DIR"/*.deb)
shopt -u nullglob
[[ ${#debs[@]} -gt 0 ]] || die "no .deb files in $DEBS_DIR"
for p in libyaml-cpp0.7 libyaml-cpp-dev libfmt9 libfmt-dev libcli11-dev libboost1.74-dev libgtest-dev libsqlite3-0 libsqlite3-dev; do
  compgen -G "$DEBS_DIR/${p}_*.deb" >/dev/null || die "$DEBS_DIR lacks ${p}_*.deb (re-run scripts/stage_offline.sh)"
done
if [[ -f "$DEBS_DIR/SHA256SUMS" ]] && command -v sha256sum >/dev/null 2>&1; then
  (cd "$DEBS_DIR" && sha256sum --quiet -c SHA256SUMS) || die "checksums in $DEBS_DIR/SHA256SUMS do not match (incomplete copy?)"
  log "checksums of ${#debs[@]} .debs OK"
fi

deb_field() {  # deb_field FILE FIELD
  if command -v dpkg-deb >/dev/null 2>&1; then
    dpkg-deb -f "$1" "$2"
  else  # name_version_arch.deb
    local b; b="$(basename "$1" .deb)"; [[ "$2" == Architecture ]] && echo "${b##*_}"
  fi
}

# Architecture of the staged packages vs this host.
DEB_ARCH=""
for d in "${debs[@]}"; do
  a="$(deb_field "$d" Architecture)"
  [[ "$a" == all ]] && continue
  [[ -z "$DEB_ARCH" || "$DEB_ARCH" == "$a" ]] || die "mixed architectures in $DEBS_DIR ($DEB_ARCH and $a)"
  DEB_ARCH="$a"
done
case "$(uname -m)" in
  x86_64) HOST_ARCH=amd64 ;; aarch64) HOST_ARCH=arm64 ;; *) HOST_ARCH="$(uname -m)" ;;
esac
[[ "$DEB_ARCH" == "$HOST_ARCH" ]] || die "staged packages are $DEB_ARCH but this host is $HOST_ARCH; stage them on a $HOST_ARCH Debian machine"
case "$DEB_ARCH" in
  amd64) MULTIARCH=x86_64-linux-gnu ;; arm64) MULTIARCH=aarch64-linux-gnu ;; *) die "unsupported architecture $DEB_ARCH" ;;
esac

# ---------------------------------------------------------------- prefix + extraction
writable_dir() { mkdir -p "$1" 2>/dev/null && [[ -w "$1" ]]; }
if [[ -z "$PREFIX" ]]; then
  if writable_dir /opt/deps; then
    PREFIX=/opt/deps
  else
    PREFIX="${HOME:?HOME is not set}/.memlab-deps"
    log "/opt/deps is not writable, using $PREFIX"
  fi
fi
writable_dir "$PREFIX" || die "cannot create or write the prefix $PREFIX"
PREFIX="$(cd "$PREFIX" && pwd)"
LIBDIR="$PREFIX/usr/lib/$MULTIARCH"

extract() {  # extract DEB DIR
  if command -v dpkg-deb >/dev/null 2>&1; then
    dpkg-deb -x "$1" "$2"
  else  # no dpkg: a .deb is an ar archive holding data.tar.{xz,zst,gz}
    command -v ar >/dev/null 2>&1 || die "neither dpkg-deb nor ar is available to unpack $1"
    local member; member="$(ar t "$1" | grep '^data\.tar' | head -n1)"
    case "$member" in
      data.tar.xz) ar p "$1" "$member" | tar -xJ -C "$2" ;;
      data.tar.zst) ar p "$1" "$member" | zstd -dc | tar -x -C "$2" ;;
      data.tar.gz) ar p "$1" "$member" | tar -xz -C "$2" ;;
      data.tar) ar p "$1" "$member" | tar -x -C "$2" ;;
      *) die "cannot unpack $1 (member '$member')" ;;
    esac
  fi
}
log "unpacking ${#debs[@]} packages into $PREFIX"
for d in "${debs[@]}"; do
  extract "$d" "$PREFIX" || die "failed to unpack $d"
done

# Symlinks with absolute targets would point back into the host's /usr: re-point them into the prefix.
while IFS= read -r -d '' l; do
  t="$(readlink "$l")"
  case "$t" in
    "$PREFIX"/*) ;;
    /*) ln -sfn "$PREFIX$t" "$l"; log "re-pointed symlink ${l#"$PREFIX"} -> $PREFIX$t" ;;
  esac
done < <(find "$PREFIX/usr" -type l -print0)

# Debian's CMake package files compute their paths relative to their own location, but make sure:
# any remaining absolute "/usr..." path in them (and the pkg-config prefix) is rewritten to the prefix.
cmake_dirs=()
for d in "$LIBDIR/cmake" "$PREFIX/usr/share/cmake" "$PREFIX/usr/lib/cmake"; do
  [[ -d "$d" ]] && cmake_dirs+=("$d")
done
patched=0
while IFS= read -r -d '' f; do
  if grep -Eq '"/usr("|/)|;/usr/' "$f"; then
    sed -i -E "s#\"/usr(\"|/)#\"$PREFIX/usr\\1#g; s#;/usr/#;$PREFIX/usr/#g" "$f"
    patched=$((patched + 1))
  fi
done < <(find "${cmake_dirs[@]}" -name '*.cmake' -type f -print0)
while IFS= read -r -d '' f; do
  sed -i -E "s#^(prefix|exec_prefix)=/usr\$#\\1=$PREFIX/usr#" "$f"
done < <(find "$PREFIX/usr" -path '*/pkgconfig/*.pc' -type f -print0)
log "CMake package files with absolute /usr paths rewritten to the prefix: $patched"
# Whatever still names /usr outside comments is shown, so it can be judged (e.g. Boost's build-dir check).
leftover="$(grep -rn '/usr' "${cmake_dirs[@]}" --include='*.cmake' | grep -vF "$PREFIX/usr" | grep -Ev ':[0-9]+:[[:space:]]*#' || true)"
if [[ -n "$leftover" ]]; then
  log "note: remaining /usr mentions in CMake files:"
  echo "$leftover" | sed 's/^/    /'
fi

for f in "$LIBDIR/cmake/yaml-cpp/yaml-cpp-targets.cmake" "$LIBDIR/cmake/fmt/fmt-config.cmake" \
         "$LIBDIR/cmake/Boost-1.74.0/BoostConfig.cmake" "$PREFIX/usr/share/cmake/CLI11/CLI11Config.cmake" \
         "$LIBDIR/cmake/GTest/GTestConfig.cmake" "$PREFIX/usr/include/boost/random/mersenne_twister.hpp" \
         "$PREFIX/usr/include/yaml-cpp/yaml.h" "$PREFIX/usr/include/CLI/CLI.hpp" "$PREFIX/usr/include/gtest/gtest.h"; do
  [[ -e "$f" ]] || die "expected $f after unpacking; the staged set is incomplete"
done

# fmt: LibTorch bundles fmt v12 headers, Debian's libfmt-dev is v9 (the project builds fmt header-only,
# so no libfmt.so gets linked). On Debian, /usr/include/fmt is searched *after* torch's include dir, so
# torch code sees v12 and torch-free code v9. Unpacked here, $PREFIX/usr/include would come *before*
# torch's include dir (it is an -isystem of the yaml-cpp target); keep the Debian layout's order by moving
# fmt's headers to a directory searched last (-idirafter).
LATE_INC="$PREFIX/usr/include-late"
rm -rf "$LATE_INC/fmt"
if [[ -d "$PREFIX/usr/include/fmt" ]]; then
  mkdir -p "$LATE_INC"
  mv "$PREFIX/usr/include/fmt" "$LATE_INC/fmt"
fi
[[ -f "$LATE_INC/fmt/format.h" ]] || die "fmt headers missing after unpacking (libfmt-dev)"

# ---------------------------------------------------------------- configure + build
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"   # test discovery runs binaries at build time

cmake_args=(-S "$REPO_ROOT" -B "$BUILD_DIR"
  -DCMAKE_BUILD_TYPE=Release
  -DMEMLAB_TESTS="$TESTS"
  "-DCMAKE_PREFIX_PATH=$TORCH_CMAKE;$LIBDIR/cmake;$PREFIX/usr/share/cmake;$PREFIX/usr"
  "-DCMAKE_INCLUDE_PATH=$PREFIX/usr/include"
  "-DCMAKE_LIBRARY_PATH=$LIBDIR"
  # Pin the packages to the prefix, so a different copy elsewhere on the host is not picked up.
  "-Dyaml-cpp_DIR=$LIBDIR/cmake/yaml-cpp"
  "-Dfmt_DIR=$LIBDIR/cmake/fmt"
  "-DCLI11_DIR=$PREFIX/usr/share/cmake/CLI11"
  "-DBoost_DIR=$LIBDIR/cmake/Boost-1.74.0"
  "-DBoost_INCLUDE_DIR=$PREFIX/usr/include"
  "-DCMAKE_CXX_FLAGS=${CXXFLAGS:+$CXXFLAGS }-idirafter $LATE_INC")
[[ "$TESTS" == ON ]] && cmake_args+=("-DGTest_DIR=$LIBDIR/cmake/GTest")
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  if command -v ninja >/dev/null 2>&1; then
    cmake_args+=(-G Ninja)
  else
    log "ninja not found, using CMake's default generator"
  fi
fi
log "configuring $BUILD_DIR (tests $TESTS)"
cmake "${cmake_args[@]}" "${EXTRA_CMAKE_ARGS[@]}" || die "cmake configure failed (see output above)"

# Report where the dependencies were found.
for v in yaml-cpp_DIR fmt_DIR CLI11_DIR Boost_DIR GTest_DIR; do
  val="$(grep -E "^$v:" "$BUILD_DIR/CMakeCache.txt" | cut -d= -f2- || true)"
  [[ -n "$val" ]] && log "  $v = $val"
  if [[ -n "$val" && "$val" != "$PREFIX"/* && "$val" != *-NOTFOUND ]]; then
    log "WARNING: $v is outside $PREFIX"
  fi
done

# env.sh exists before the build, so it can be sourced even if the build stops half-way.
mkdir -p "$BUILD_DIR"
cat > "$BUILD_DIR/env.sh" <<EOF
# Generated by scripts/build_offline.sh: libyaml-cpp.so.0.7 (and libfmt.so.9) from the unpacked Debian packages.
export LD_LIBRARY_PATH="$LIBDIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
EOF

jobs="$(nproc 2>/dev/null || echo 2)"
log "building in $BUILD_DIR with $jobs jobs"
cmake --build "$BUILD_DIR" -j "$jobs" || die "build failed (see compiler output above)"

if command -v readelf >/dev/null 2>&1 && readelf -d "$BUILD_DIR/memlab" 2>/dev/null | grep -q 'NEEDED.*libyaml-cpp'; then
  log "memlab links libyaml-cpp dynamically from $LIBDIR; in a new shell run:"
  echo "  export LD_LIBRARY_PATH=\"$LIBDIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
  echo "  (or: source $BUILD_DIR/env.sh)"
fi
if readelf -d "$BUILD_DIR/memlab" 2>/dev/null | grep -q 'NEEDED.*libfmt'; then
  log "WARNING: memlab links libfmt.so; the project expects header-only fmt (FMT_HEADER_ONLY)"
fi
log "done: binary $BUILD_DIR/memlab"
[[ "$TESTS" == ON ]] && log "run tests with: source $BUILD_DIR/env.sh && ctest --test-dir $BUILD_DIR --output-on-failure"
exit 0
