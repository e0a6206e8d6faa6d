#!/usr/bin/env bash
# Reproduce a results/reference/ entry on a GPU host: build (offline if .offline/ is present), show the GPU,
# run the GPU-side tests, then train one config and copy its run files to DEST.
#
#   bash scripts/reference_run.sh CONFIG DEST [memlab train options...]
#
# e.g. bash scripts/reference_run.sh configs/hqlt/parity_deltanet_neg.yaml /tmp/ref --lr 1e-3
set -euo pipefail
[[ $# -ge 2 ]] || { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
CONFIG=$1 DEST=$2
shift 2
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
BUILD=${MEMLAB_BUILD_DIR:-build}
mkdir -p "$DEST"
if [[ ! -x "$BUILD/memlab" ]]; then
  if [[ -d .offline ]]; then
    bash scripts/build_offline.sh --build-dir "$BUILD" >"$DEST/build.log" 2>&1 || { tail -40 "$DEST/build.log"; exit 1; }
  else
    bash scripts/setup.sh --build-dir "$BUILD" >"$DEST/build.log" 2>&1 || { tail -40 "$DEST/build.log"; exit 1; }
  fi
fi
[[ -f "$BUILD/env.sh" ]] && source "$BUILD/env.sh"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [[ -x "$BUILD/memlab_tests" ]]; then
  "$BUILD/memlab_tests" --gtest_filter='Cuda*:DeltaRule*:DeltaNet*' --gtest_brief=1 || exit 1
fi
RUN="$DEST/run"
rm -rf "$RUN"
echo "command: memlab train --config $CONFIG --out $RUN $*"
"$BUILD/memlab" train --config "$CONFIG" --out "$RUN" "$@"
