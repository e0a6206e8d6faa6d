#!/usr/bin/env bash
# Train every registered mixer for a few steps on CUDA (CUDA-graph step, bf16 autocast) and print one line
# each: how the step ran, its speed and the final evaluation. A mixer whose CUDA path breaks stops nothing
# else; the script exits non-zero at the end if any failed.
#
#   bash scripts/gpu_smoke.sh [BUILD_DIR] [DEST]      (defaults: build, /tmp/memlab-gpu-smoke)
# MEMLAB_DEVICE and MEMLAB_STEPS override the device (cuda) and the number of steps (60).
set -uo pipefail
BUILD=${1:-build} DEST=${2:-/tmp/memlab-gpu-smoke}
MEMLAB="$BUILD/memlab"
[[ -x "$MEMLAB" ]] || { echo "gpu_smoke: no $MEMLAB (build first)" >&2; exit 2; }
mkdir -p "$DEST"
# The unknown-model error lists every registered mixer.
allowed=$("$MEMLAB" train --task parity --model no-such-mixer 2>&1 | sed -n 's/.*allowed: \(.*\))$/\1/p')
[[ -n "$allowed" ]] || { echo "gpu_smoke: could not read the mixer list" >&2; exit 2; }
IFS=', ' read -r -a models <<<"$allowed"
runs=()
for m in "${models[@]}"; do [[ -n "$m" ]] && runs+=("$m:"); done
runs+=("hqlt:--set model.hqlt.variant=delayed_stream" "hqlt:--set model.hqlt.variant=delayed_chunk"
       "hqlt:--set model.hqlt.fw_memory=linear_attention")
failed=0
for r in "${runs[@]}"; do
  m=${r%%:*} extra=${r#*:}
  name="$m$(echo "$extra" | sed 's/.*=/_/')"
  out="$DEST/$name"
  rm -rf "$out"
  # shellcheck disable=SC2086
  if "$MEMLAB" train --task parity --model "$m" $extra --device "${MEMLAB_DEVICE:-cuda}" --steps "${MEMLAB_STEPS:-60}" --batch-size 256 \
       --set train.log_every=30 --set eval.every="${MEMLAB_STEPS:-60}" --set eval.n=512 --out "$out" >"$DEST/$name.log" 2>&1; then
    speed=$(grep -o '[0-9.]* ms/step' "$DEST/$name.log" | tail -1)
    mode=$(sed -n 's/.*training step: //p' "$DEST/$name.log" | tail -1)
    ev=$(grep '^eval step' "$DEST/$name.log" | tail -1)
    echo "ok   $name | ${mode:-?} | $speed | $ev"
  else
    failed=1
    echo "FAIL $name: $(grep -i 'error' "$DEST/$name.log" | head -1)"
    tail -5 "$DEST/$name.log" | sed 's/^/     /'
  fi
done
exit $failed
