#!/usr/bin/env bash
# memlab setup: install what is missing (Debian packages, LibTorch via pip), configure and build.
#
#   bash scripts/setup.sh [--no-tests] [--build-dir DIR]
#
# Idempotent: apt runs only when a package is missing (checked with dpkg -s), pip only when
# `import torch` fails or torch is not 2.11.0. Re-running just re-configures and rebuilds incrementally.
# Then: ctest --test-dir build --output-on-failure
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

TORCH_VERSION=2.11.0
APT_PACKAGES=(cmake ninja-build g++ libyaml-cpp-dev libfmt-dev libcli11-dev libboost-dev libsqlite3-dev libcairo2-dev
              libgtest-dev googletest python3)

log() { echo "memlab setup: $*"; }
die() { echo "memlab setup: ERROR: $*" >&2; exit 1; }
trap 'rc=$?; echo "memlab setup: ERROR: command failed (exit $rc) at line $LINENO: $BASH_COMMAND" >&2' ERR

usage() {
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
}

TESTS=ON
BUILD_DIR=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-tests) TESTS=OFF; shift ;;
    --build-dir)
      [[ $# -ge 2 && -n "$2" ]] || die "--build-dir needs a directory argument"
      BUILD_DIR="$2"; shift 2 ;;
    --build-dir=*) BUILD_DIR="${1#--build-dir=}"; [[ -n "$BUILD_DIR" ]] || die "--build-dir needs a directory argument"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (try --help)" ;;
  esac
done

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "$BUILD_DIR" ]]; then
  BUILD_DIR="$REPO_ROOT/build"
elif [[ "$BUILD_DIR" != /* ]]; then
  BUILD_DIR="$PWD/$BUILD_DIR"   # relative to where the script was invoked
fi
cd "$REPO_ROOT"

# ---------------------------------------------------------------- privileges for apt
SUDO=()
if [[ "$(id -u)" -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    SUDO=(__no_root__)
  fi
fi

apt_install() {
  [[ "${SUDO[*]:-}" != "__no_root__" ]] || die "need to install Debian packages ($*) but not root and sudo is not available; install them and re-run"
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found: install these packages by hand: $*"
  log "apt-get update"
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q || die "apt-get update failed"
  log "apt-get install $*"
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
    || die "apt-get install failed for: $*"
}

# ---------------------------------------------------------------- state checks
torch_ok() {
  # Accepts local version tags (2.11.0+cu130, 2.11.0+cpu). Import noise (NumPy warning) goes to /dev/null.
  python3 -c "import sys, torch; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 3)" \
    >/dev/null 2>&1
}

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
need_torch=1
if command -v python3 >/dev/null 2>&1 && torch_ok; then
  need_torch=0
fi
# pip is only needed when torch has to be installed.
if [[ $need_torch -eq 1 ]]; then
  if ! command -v python3 >/dev/null 2>&1 || ! python3 -m pip --version >/dev/null 2>&1; then
    dpkg -s python3-pip >/dev/null 2>&1 || missing+=(python3-pip)
  fi
fi

if [[ ${#missing[@]} -gt 0 ]]; then
  log "missing Debian packages: ${missing[*]}"
  apt_install "${missing[@]}"
else
  log "Debian packages present: ${APT_PACKAGES[*]}"
fi
command -v python3 >/dev/null 2>&1 || die "python3 not found on PATH"

if [[ $need_torch -eq 1 ]]; then
  have="$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"
  log "torch is '$have', need $TORCH_VERSION: python3 -m pip install torch==$TORCH_VERSION (large download)"
  python3 -m pip --version >/dev/null 2>&1 || die "python3 -m pip is not available (install python3-pip)"
  # Debian's python is PEP 668 'externally managed'; allow the install there (no-op elsewhere).
  PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore \
    python3 -m pip install "torch==$TORCH_VERSION" || die "pip install torch==$TORCH_VERSION failed"
  torch_ok || die "torch $TORCH_VERSION still not importable by python3 after pip install"
fi
log "torch $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null) OK"

# flash-linear-attention's naive reference functions, for the external check (tests/check_fla_naive.py).
# Optional: without it (an offline host) that one test is skipped and says why.
FLA_VERSION=0.6.0
if python3 -c "import fla.ops.mesa_net.naive" >/dev/null 2>&1; then
  log "flash-linear-attention present (external check)"
elif python3 -m pip --version >/dev/null 2>&1; then
  log "installing flash-linear-attention==$FLA_VERSION (pure Python; for the external check against its naive.py)"
  PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore \
    python3 -m pip install -q --no-deps "flash-linear-attention==$FLA_VERSION" "fla-core==$FLA_VERSION" einops packaging \
    || log "warning: could not install flash-linear-attention; the external check will be skipped"
else
  log "warning: no pip; flash-linear-attention not installed, the external check will be skipped"
fi

TORCH_CMAKE="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)" \
  || die "could not ask python3 for torch.utils.cmake_prefix_path"
[[ -d "$TORCH_CMAKE" ]] || die "torch cmake prefix '$TORCH_CMAKE' does not exist"

# ---------------------------------------------------------------- CUDA toolkit
# The PyPI torch wheel is a CUDA build, and its CMake package refuses to configure without a CUDA
# toolkit (nvcc, headers, libcudart), even for CPU-only use. A GPU host has one; a plain Debian
# machine does not: then fetch NVIDIA's toolkit wheels from PyPI (pinned by torch's own
# cuda-toolkit requirement) into a private directory and point CMake at it. No GPU/driver needed.
cuda_args=()
ensure_cuda_toolkit() {
  local tcuda ver dir root n f
  tcuda="$(python3 -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null || true)"
  if [[ -z "$tcuda" ]]; then
    log "torch is a CPU-only build: no CUDA toolkit needed"
    return 0
  fi
  # Places CMake looks at by itself.
  for n in "${CUDACXX:-}" "$(command -v nvcc 2>/dev/null || true)" "${CUDA_PATH:+$CUDA_PATH/bin/nvcc}" /usr/local/cuda/bin/nvcc; do
    if [[ -n "$n" && -x "$n" ]] && "$n" --version >/dev/null 2>&1; then
      log "CUDA toolkit present: $n (torch built with CUDA $tcuda)"
      return 0
    fi
  done
  if [[ -n "${CUDA_HOME:-}" && -x "$CUDA_HOME/bin/nvcc" ]]; then
    root="$CUDA_HOME"
    log "CUDA toolkit from CUDA_HOME: $root"
  else
    ver="$(python3 -c 'import re, importlib.metadata as m
for r in m.requires("torch") or []:
    x = re.match(r"cuda-toolkit\b[^=;]*==\s*([0-9][0-9.]*)", r)
    if x: print(x.group(1)); break' 2>/dev/null || true)"
    [[ -n "$ver" ]] || die "no CUDA toolkit (nvcc) found and torch does not pin a cuda-toolkit wheel; install CUDA $tcuda and put nvcc on PATH (or set CUDA_HOME)"
    dir="${MEMLAB_CUDA_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/memlab/cuda-toolkit-$ver}"
    n="$(ls -d "$dir"/nvidia/cu*/bin/nvcc 2>/dev/null | head -n1 || true)"
    if [[ -z "$n" ]] || ! "$n" --version >/dev/null 2>&1; then
      log "no CUDA toolkit found (torch built with CUDA $tcuda): installing cuda-toolkit==$ver wheels from PyPI into $dir"
      rm -rf "$dir.partial"
      mkdir -p "$(dirname "$dir")"
      PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore \
        python3 -m pip install -q --target "$dir.partial" "cuda-toolkit[nvcc,crt,cccl,nvvm,cudart,nvrtc]==$ver" \
        || die "pip install cuda-toolkit==$ver failed"
      rm -rf "$dir"
      mv "$dir.partial" "$dir"
      n="$(ls -d "$dir"/nvidia/cu*/bin/nvcc 2>/dev/null | head -n1 || true)"
      [[ -n "$n" ]] || die "the cuda-toolkit wheels in $dir contain no nvcc"
    else
      log "CUDA toolkit $ver from PyPI already in $dir"
    fi
    root="$(cd "$(dirname "$n")/.." && pwd)"
    # Give the wheel layout what nvcc and CMake expect of a toolkit: lib64/ and unversioned .so names.
    [[ -e "$root/lib64" ]] || ln -s lib "$root/lib64"
    for f in "$root"/lib/lib*.so.*; do
      [[ -e "$f" ]] || continue
      n="${f%%.so.*}.so"
      [[ -e "$n" ]] || ln -s "$(basename "$f")" "$n"
    done
    "$root/bin/nvcc" --version >/dev/null 2>&1 || die "$root/bin/nvcc does not run"
  fi
  export PATH="$root/bin:$PATH"
  cuda_args=(-DCUDA_TOOLKIT_ROOT_DIR="$root" -DCUDAToolkit_ROOT="$root" -DCMAKE_CUDA_COMPILER="$root/bin/nvcc")
}
ensure_cuda_toolkit

# ---------------------------------------------------------------- configure + build
cmake_args=(-S "$REPO_ROOT" -B "$BUILD_DIR"
            -DCMAKE_BUILD_TYPE=Release
            -DCMAKE_PREFIX_PATH="$TORCH_CMAKE"
            -DMEMLAB_TESTS="$TESTS"
            "${cuda_args[@]}")
# Keep the generator of an existing build dir (switching generators makes cmake error out).
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake_args+=(-G Ninja)
  log "configuring new build dir $BUILD_DIR (tests $TESTS)"
else
  log "re-configuring $BUILD_DIR (tests $TESTS)"
fi
cmake "${cmake_args[@]}" || die "cmake configure failed (see output above)"

jobs="$(nproc 2>/dev/null || echo 2)"
log "building in $BUILD_DIR with $jobs jobs"
cmake --build "$BUILD_DIR" -j "$jobs" || die "build failed (see compiler output above)"

log "done: binary $BUILD_DIR/memlab"
if [[ "$TESTS" == ON ]]; then
  log "run tests with: ctest --test-dir $BUILD_DIR --output-on-failure"
fi
